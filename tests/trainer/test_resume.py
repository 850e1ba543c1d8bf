"""Three steps, a checkpoint, and fresh processes resume exactly where the run stopped (dp=2,
distributed optimizer: the optimizer state is sharded across the two ranks)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow


def test_resumed_steps_equal_the_uninterrupted_run(resume_runs):
    uninterrupted, resumed = resume_runs
    for a, b in zip(uninterrupted, resumed, strict=True):
        assert b["version"] == 3
        assert len(a["before"]) == 3 and a["before"][0] != a["before"][1]
        for key in ("loss", "grad_norm", "importance_weight_mean", "approx_kl", "clip_fraction", "version"):
            assert [m[key] for m in b["after"]] == [m[key] for m in a["after"]], key
    weights_a, weights_b = uninterrupted[0]["weights"], resumed[0]["weights"]
    assert weights_a and sorted(weights_a) == sorted(weights_b)
    for name, tensor in weights_a.items():
        assert torch.equal(weights_b[name], tensor), name


@pytest.mark.parametrize("case, message", [
    ("wrong_shape", "Global shape mismatch for loaded (torch.Size([4, 768, 128])) and expected ((4, 512, 128))"
                    " tensor for key decoder.layers.mlp.linear_fc1.weight"),
    ("not_a_checkpoint", "not a trainer checkpoint (no metadata.json)"),
])
def test_bad_trainer_checkpoints_are_named(resume_runs, case, message):
    for result in resume_runs[1]:
        error = result["errors"][case]
        assert error.startswith("WeightsError:") and message in error, error
