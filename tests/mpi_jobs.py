"""Launching real MPI jobs of the system: `.venv/bin/mpiexec -n N python -m areal_hpc.launch`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MPIEXEC = Path(sys.executable).with_name("mpiexec")
CONFIG = "configs/experiments/tiny-cpu.yaml"


@dataclass
class Job:
    returncode: int
    output: str
    seconds: float


def job_command(n: int, overrides: list[str], config: str = CONFIG) -> list[str]:
    cmd = [str(MPIEXEC), "-n", str(n), sys.executable, "-m", "areal_hpc.launch", config]
    for o in overrides:
        cmd += ["--set", o]
    return cmd


def job_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_LOGGING_LEVEL="WARNING", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def run_job(n: int, overrides: list[str], timeout: float, config: str = CONFIG, **env: str) -> Job:
    start = time.monotonic()
    proc = subprocess.run(
        job_command(n, overrides, config), env=job_env(**env), capture_output=True, text=True, timeout=timeout
    )
    return Job(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start)
