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
from dataclasses import dataclass
from pathlib import Path

from areal_hpc.config.load import load_config
from areal_hpc.metrics.jsonl import read_records
from areal_hpc.metrics.writer import METRICS_FILE
from areal_hpc.recipes.warm_start import ensure_prepared

CONFIG = "configs/experiments/quickstart.yaml"
MPIEXEC = Path(sys.executable).with_name("mpiexec")


# The randomly initialised tiny Qwen2 of tiny-cpu (seed 0): long answers, so generation costs as
# much as training. Under sim_validation's name, where it was first built (its runs name the path).
RANDOM_MODEL_DIR = Path(".cache/sim_validation/tiny-qwen2")
RANDOM_MODEL_CONFIG = "configs/experiments/tiny-cpu.yaml"


def warm_model() -> Path:
    return ensure_prepared(load_config(CONFIG))


def random_model() -> Path:
    """The randomly initialised tiny Qwen2, built once."""
    if not (RANDOM_MODEL_DIR / "config.json").is_file():
        from areal_hpc.data.tiny_model import build_tiny_model

        build_tiny_model(load_config(RANDOM_MODEL_CONFIG).model, RANDOM_MODEL_DIR, seed=0)
    return RANDOM_MODEL_DIR


@dataclass(frozen=True)
class Job:
    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    # Wall clock (time.time()) when mpiexec started and when it ended.
    started: float
    ended: float

    @property
    def seconds(self) -> float:
        return self.ended - self.started


def command(run_dir: Path, overrides: list[str], config: str = CONFIG, ranks: int = 3,
            mpiexec_args: list[str] | None = None) -> list[str]:
    """The mpiexec command of one job of `config` on `ranks` MPI ranks into `run_dir`
    (checkpoint.resume=never unless the overrides say otherwise)."""
    cmd = [str(MPIEXEC), *(mpiexec_args or []), "-n", str(ranks), sys.executable, "-m", "areal_hpc.launch", config,
           "--set", f"logging.dir={run_dir}", "--set", "checkpoint.resume=never", "--set", "logging.tensorboard=false"]
    for o in overrides:
        cmd += ["--set", o]
    return cmd


def environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """The job's environment: this one, one thread per rank, vLLM's warnings only, and `env`."""
    return dict(os.environ, OMP_NUM_THREADS="1", VLLM_LOGGING_LEVEL="WARNING", **(env or {}))


def launch(run_dir: Path, overrides: list[str], timeout: float = 1800, config: str = CONFIG, ranks: int = 3,
           env: dict[str, str] | None = None, mpiexec_args: list[str] | None = None) -> Job:
    """One job (`command`), whatever its exit status; `env` adds to the environment. A job past
    `timeout` is stopped (its process group: mpiexec and the ranks it started) and raised."""
    cmd = command(run_dir, overrides, config, ranks, mpiexec_args)
    started = time.time()
    proc = subprocess.Popen(cmd, env=environment(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RuntimeError(f"job past {timeout:.0f} s, stopped: {shlex.join(cmd)}") from None
    return Job(cmd, proc.returncode, out, err, started, time.time())


def run(run_dir: Path, overrides: list[str], timeout: float = 1800, config: str = CONFIG,
        ranks: int = 3) -> tuple[list[dict], float]:
    """Launch one job (launch) that must succeed; returns its metrics records and wall seconds."""
    job = launch(run_dir, overrides, timeout, config, ranks)
    if job.returncode != 0:
        sys.stderr.write(job.stdout[-3000:] + job.stderr[-6000:])
        raise RuntimeError(f"job failed ({job.returncode}): {shlex.join(job.command)}")
    return read_records(run_dir / METRICS_FILE), job.seconds


def steps(records: list[dict]) -> list[dict]:
    return [r for r in records if "trained_tokens" in r]


def evals(records: list[dict]) -> list[dict]:
    return [r for r in records if "eval_accuracy" in r]
