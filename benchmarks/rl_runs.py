"""Running the whole system as the benchmarks measure it: one mpiexec job of the quickstart
experiment (the tiny CPU profile: controller, trainer, generator), its metrics read back from the
run directory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from areal_hpc.config.load import load_config
from areal_hpc.metrics.jsonl import read_records
from areal_hpc.metrics.writer import METRICS_FILE
from areal_hpc.recipes.warm_start import ensure_prepared

CONFIG = "configs/experiments/quickstart.yaml"
MPIEXEC = Path(sys.executable).with_name("mpiexec")


def warm_model() -> Path:
    return ensure_prepared(load_config(CONFIG))


def run(run_dir: Path, overrides: list[str], timeout: float = 1800) -> tuple[list[dict], float]:
    """Launch one job into `run_dir`; returns its metrics records and wall seconds. Fails loudly."""
    cmd = [str(MPIEXEC), "-n", "3", sys.executable, "-m", "areal_hpc.launch", CONFIG,
           "--set", f"logging.dir={run_dir}", "--set", "checkpoint.resume=never", "--set", "logging.tensorboard=false"]
    for o in overrides:
        cmd += ["--set", o]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise RuntimeError(f"job failed ({proc.returncode}): {' '.join(cmd)}")
    return read_records(run_dir / METRICS_FILE), seconds


def steps(records: list[dict]) -> list[dict]:
    return [r for r in records if "trained_tokens" in r]


def evals(records: list[dict]) -> list[dict]:
    return [r for r in records if "eval_accuracy" in r]
