"""Running the whole system as the benchmarks measure it: one mpiexec job (by default of the
quickstart experiment on 3 ranks: controller, trainer, generator), its metrics read back from the
run directory."""

from __future__ import annotations

import os
import shlex
import signal
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


def run(run_dir: Path, overrides: list[str], timeout: float = 1800, config: str = CONFIG,
        ranks: int = 3) -> tuple[list[dict], float]:
    """Launch one job of `config` on `ranks` MPI ranks into `run_dir`; returns its metrics records
    and wall seconds. Fails loudly; a job past `timeout` is stopped (its process group: mpiexec and
    the ranks it started) and raised."""
    cmd = [str(MPIEXEC), "-n", str(ranks), sys.executable, "-m", "areal_hpc.launch", config,
           "--set", f"logging.dir={run_dir}", "--set", "checkpoint.resume=never", "--set", "logging.tensorboard=false"]
    for o in overrides:
        cmd += ["--set", o]
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_LOGGING_LEVEL="WARNING")
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RuntimeError(f"job past {timeout:.0f} s, stopped: {shlex.join(cmd)}") from None
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        sys.stderr.write(out[-3000:] + err[-6000:])
        raise RuntimeError(f"job failed ({proc.returncode}): {shlex.join(cmd)}")
    return read_records(run_dir / METRICS_FILE), seconds


def steps(records: list[dict]) -> list[dict]:
    return [r for r in records if "trained_tokens" in r]


def evals(records: list[dict]) -> list[dict]:
    return [r for r in records if "eval_accuracy" in r]
