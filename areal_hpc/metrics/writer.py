"""Per-step metrics to <logging.dir>/metrics.jsonl (one JSON object per step) and TensorBoard."""

from __future__ import annotations

import json
from pathlib import Path

from areal_hpc.metrics.jsonl import read_records, rewrite_records

METRICS_FILE = "metrics.jsonl"


class MetricsWriter:
    def __init__(self, run_dir: str | Path, tensorboard: bool = True, resume_step: int = 0) -> None:
        """On resume, records of steps the checkpoint does not contain are dropped."""
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / METRICS_FILE
        kept = [r for r in read_records(self.path) if r["step"] <= resume_step] if resume_step else []
        rewrite_records(self.path, kept)
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.dir / "tensorboard"), purge_step=resume_step + 1 if resume_step else None)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, **metrics}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, int | float):
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
