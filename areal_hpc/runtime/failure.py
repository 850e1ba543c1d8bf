"""Failures end the whole job within seconds, named by rank 0; nothing waits forever.

A worker that raises sends WorkerFailed to rank 0 and waits to be aborted; rank 0 prints the
rank, role and reason and calls MPI_Abort, which makes mpiexec (or srun) kill every rank and exit
non-zero. If rank 0 cannot do it in time, the worker leaves with os._exit, which the launcher
also treats as a failure of the job. (A generator's error once the run is under way is survived:
rank 0 drops the rank and cuts its lifeline, which ends its process; runtime/controller_rank.py.)
A rank killed outright (kill -9) is seen by the launcher too,
and by rank 0 through the rank's lifeline (wire/lifeline.py); the rank's children die with it
(runtime/parent_death.py).
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
import sys
import termios
import time
import traceback

from areal_hpc.wire.layout import Role
from areal_hpc.wire.messages import WorkerFailed
from areal_hpc.wire.transport import Mailbox

CONTROLLER_RANK = 0
# Seconds a failed worker waits for rank 0's abort before leaving on its own.
ABORT_GRACE_S = 10.0
# The launcher forwards a rank's output asynchronously and may kill the job first: without a wait,
# mpiexec lost rank 0's last line in 11 of 40 runs on a 2-core machine. So rank 0 waits until the
# launcher has read its output pipes (at most ABORT_DRAIN_S), then ABORT_OUTPUT_S more for the
# launcher to pass on what it read, then aborts.
ABORT_DRAIN_S = 10.0
ABORT_OUTPUT_S = 1.0


def reason_of(exc: BaseException) -> str:
    """The exception and where it was raised, on one line."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno} in {tb[-1].name})" if tb else ""
    return f"{type(exc).__name__}: {exc}{where}"


def describe(failed: WorkerFailed) -> str:
    return f"rank {failed.rank} ({failed.role} {failed.index}) failed: {failed.reason}"


# The error this process already reported to rank 0 (one rank per process): reported once.
_reported: list[BaseException] = []


def report_failure(chan: Mailbox, role: Role, index: int, exc: BaseException) -> None:
    """Print `exc` and send it to rank 0, once per process. A rank calls it before its own clean-up
    (an engine's shutdown can hang), so rank 0 hears of the error whatever the clean-up does."""
    if _reported:
        return
    _reported.append(exc)
    traceback.print_exception(exc, file=sys.stderr)
    sys.stderr.flush()
    chan.send(CONTROLLER_RANK, WorkerFailed(chan.rank, role, index, reason_of(exc)))
    chan.flush(ABORT_GRACE_S / 2)


def worker_failed(chan: Mailbox, role: Role, index: int, exc: BaseException) -> None:
    """Report `exc` to rank 0 (unless done already), wait for the abort (or, for a generator rank 0
    goes on without, for the cut of its lifeline), and leave without MPI_Finalize."""
    try:
        report_failure(chan, role, index, exc)
        time.sleep(ABORT_GRACE_S)
    finally:
        os._exit(1)


def unread_output_bytes(fd: int) -> int:
    """Bytes written to `fd` that its reader has not read yet, when `fd` is a pipe (as under
    mpiexec); 0 for a file or a terminal, which hold nothing back."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return 0
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]
    except OSError:
        return 0


def abort_job(comm, message: str, code: int = 1) -> None:
    """Rank 0: print why the job ends and take every rank down, once the launcher has the line."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    deadline = time.monotonic() + ABORT_DRAIN_S
    while any(unread_output_bytes(fd) for fd in (1, 2)) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(ABORT_OUTPUT_S)
    comm.Abort(code)
    # Under SLURM's PMI2, MPI_Abort can return while srun tears the step down; nothing after an
    # abort may run (the caller's next line assumes the job is over).
    os._exit(code)
