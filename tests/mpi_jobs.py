"""Launching real MPI jobs of the system: `.venv/bin/mpiexec -n N python -m areal_hpc.launch`."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from job_processes import MARKER, job_pids

from areal_hpc.wire.stacks import STACKS_SIGNAL

MPIEXEC = Path(sys.executable).with_name("mpiexec")
CONFIG = "configs/experiments/tiny-cpu.yaml"


@dataclass
class Job:
    returncode: int
    output: str
    seconds: float


def job_command(n: int, overrides: list[str], config: str = CONFIG, mpiexec_args: tuple[str, ...] = ()) -> list[str]:
    cmd = [str(MPIEXEC), *mpiexec_args, "-n", str(n), sys.executable, "-m", "areal_hpc.launch", config]
    for o in overrides:
        cmd += ["--set", o]
    return cmd


def job_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_LOGGING_LEVEL="WARNING", PYTHONUNBUFFERED="1")
    env.setdefault(MARKER, uuid.uuid4().hex)
    env.update(extra)
    return env


_THREAD = re.compile(r"^(?:Thread|Current thread) 0x[0-9a-f]+ \(most recent call first\):$")
_LAUNCHERS = (b"mpiexec", b"hydra_pmi_proxy")  # they carry the marker; USR2 would end them
_IDLE = ("threading.py", "selectors.py", "queue.py", "concurrent/futures/thread.py")


def where_they_wait(stderr: str, frames: int = 4) -> str:
    """The stacks the job's processes printed on STACKS_SIGNAL, cut to the innermost `frames` of
    each thread that is not an idle pool or selector thread: a hung job's failure message."""
    out, block = [], []

    def flush() -> None:
        body = [line for line in block[1:] if line.startswith("  File ")]
        if body and not all(any(idle in line for idle in _IDLE) for line in body[:2]):
            out.extend([block[0], *body[:frames]])

    for line in stderr.splitlines():
        if _THREAD.match(line):
            flush()
            block = [line]
        elif block and line.startswith("  "):
            block.append(line)
        elif block:
            flush()
            block = []
    flush()
    return "\n".join(out)


def wait_or_explain(proc: subprocess.Popen, marker: str, timeout: float) -> tuple[str, str]:
    """The job's (stdout, stderr) once it ends; past `timeout`, every process of the job prints its
    stacks, is killed, and the AssertionError says where each thread waited and how the output
    ended."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    for pid in job_pids(marker):
        try:
            if not any(launcher in Path(f"/proc/{pid}/cmdline").read_bytes() for launcher in _LAUNCHERS):
                os.kill(pid, STACKS_SIGNAL)
        except (OSError, ProcessLookupError):
            continue
    time.sleep(3)
    for pid in job_pids(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    proc.kill()
    stdout, stderr = proc.communicate()
    text = [line for line in (stdout + stderr).splitlines() if not line.startswith("  File ")
            and not _THREAD.match(line)]
    raise AssertionError(f"the job ran past its {timeout:.0f} s: where its threads waited:\n"
                         f"{where_they_wait(stderr)[-6000:]}\nlast output:\n" + "\n".join(text[-25:]))


def run_script(n: int, script: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`script` (Python source) run as `n` MPI ranks; the finished process, its output captured."""
    return subprocess.run([str(MPIEXEC), "-n", str(n), sys.executable, "-c", script], env=job_env(),
                          capture_output=True, text=True, timeout=timeout)


def run_job(n: int, overrides: list[str], timeout: float, config: str = CONFIG, mpiexec_args: tuple[str, ...] = (),
            **env: str) -> Job:
    start = time.monotonic()
    environ = job_env(**env)
    proc = subprocess.Popen(job_command(n, overrides, config, mpiexec_args), env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    stdout, stderr = wait_or_explain(proc, environ[MARKER], timeout)
    return Job(proc.returncode, stdout + stderr, time.monotonic() - start)
