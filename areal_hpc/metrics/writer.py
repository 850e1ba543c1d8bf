"""Per-step metrics to <logging.dir>/metrics.jsonl (one JSON object per step), TensorBoard and,
with logging.wandb enabled, Weights & Biases (the same records, and the resolved config)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.metrics.jsonl import read_records, rewrite_records

METRICS_FILE = "metrics.jsonl"
# The wandb run id of the run in this directory, reused on resume so the wandb run continues.
WANDB_ID_FILE = "wandb_run_id"



# Characters a TensorBoard tag may not hold (tensorboardX renames them with a warning per call).
_NOT_IN_TAG = re.compile(r"[^\w./-]")


def tensorboard_tag(key: str) -> str:
    """The TensorBoard name of a metric: eval_pass@16 becomes eval_pass_16."""
    return _NOT_IN_TAG.sub("_", key)

class MetricsWriter:
    def __init__(self, run_dir: str | Path, tensorboard: bool = True, resume_step: int = 0,
                 experiment: ExperimentConfig | None = None) -> None:
        """On resume, records of steps the checkpoint does not contain are dropped. `experiment`
        (rank 0's config) turns on wandb when its logging.wandb is enabled."""
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / METRICS_FILE
        kept = [r for r in read_records(self.path) if r["step"] <= resume_step] if resume_step else []
        rewrite_records(self.path, kept)
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.dir / "tensorboard"), purge_step=resume_step + 1 if resume_step else None)
        self._wandb = None
        if experiment is not None and experiment.logging.wandb.mode != "disabled":
            self._wandb = _start_wandb(self.dir, experiment, resumed=resume_step > 0)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, **metrics}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, int | float):
                    self._tb.add_scalar(tensorboard_tag(key), value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(record)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _start_wandb(run_dir: Path, experiment: ExperimentConfig, resumed: bool) -> Any:
    """A wandb run (offline files under <run_dir>/wandb unless WANDB_DIR says otherwise). A resumed
    run continues the id kept in the run directory. wandb cannot take back what it was sent, so
    records are logged against our `step` (not wandb's own, which only grows): after a resume, the
    steps between the checkpoint and the interruption appear twice there, not in metrics.jsonl."""
    import wandb  # only when enabled: the import alone takes about half a second

    cfg = experiment.logging.wandb
    id_file = run_dir / WANDB_ID_FILE
    run_id = id_file.read_text().strip() if resumed and id_file.is_file() else secrets.token_hex(4)
    id_file.write_text(run_id + "\n")
    run = wandb.init(project=cfg.project, name=cfg.name or experiment.name, id=run_id, resume="allow",
                     mode=cfg.mode, dir=os.environ.get("WANDB_DIR") or str(run_dir),
                     config=dataclasses.asdict(experiment),
                     # console="off": rank 0's progress bar and log lines stay as they are.
                     settings=wandb.Settings(console="off", quiet=True, save_code=False))
    run.define_metric("*", step_metric="step")
    return run
