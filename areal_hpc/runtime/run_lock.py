"""One job per run directory: rank 0 holds an exclusive lock on `<logging.dir>/.lock` for its life.

Two jobs writing one run directory would interleave their metrics and ledgers and prune each
other's checkpoints; the second is refused at preflight, naming the holder (its SLURM job id, or
its process and host). The lock is flock(2): released by the kernel when the holder dies, however
it dies, so a crashed job never leaves a stale lock. On NFS and Lustre flock needs the file
system's lock support (NFSv4, or Lustre mounted with `flock`); without it the lock call fails and
the launch says so.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

from areal_hpc.errors import UserError

LOCK_FILE = ".lock"
# Open lock files of this process: kept for its whole life (closing one releases the lock).
_held: dict[Path, int] = {}


def holder_id() -> str:
    job = os.environ.get("SLURM_JOB_ID")
    where = f"process {os.getpid()} on {socket.gethostname()}"
    return f"SLURM job {job} ({where})" if job else where


def hold(run_dir: str | Path) -> None:
    """Take the run directory's lock, or raise UserError naming the job that holds it."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _held:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another job"
        os.close(fd)
        raise UserError(f"run directory {run_dir} is in use by {holder}: give this job its own"
                        " logging.dir, or stop that one first") from None
    except OSError as e:
        os.close(fd)
        raise UserError(f"run directory {run_dir}: cannot lock {path} ({e}); the file system must"
                        " support flock") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, (holder_id() + "\n").encode(), 0)
    _held[run_dir] = fd
