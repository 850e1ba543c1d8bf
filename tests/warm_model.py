"""The warm-started tiny model for tests that need a right answer now and then (a chat template
that reached the model, a real run's rewards): the quickstart's task (+ and -, 1 to 4
operations) stopped at its first validation with 0.1 greedy accuracy, 400 SFT steps (under a
minute on a fresh machine, cached after) instead of the 2,400 of tiny-cpu's own warm start."""

from __future__ import annotations

from pathlib import Path

CONFIG = "configs/experiments/quickstart.yaml"
# Without the quickstart's slipped solutions: a right answer more often, after fewer SFT steps.
OVERRIDES = ["data.synthetic_warm_start_accuracy=0.1", "data.synthetic_warm_start_slips=0"]


def warm_model_dir() -> Path:
    from areal_hpc.config.load import load_config
    from areal_hpc.recipes.warm_start import ensure_prepared

    return ensure_prepared(load_config(CONFIG, OVERRIDES)).resolve()
