"""How long a rank waits for the rest of its job to start before it ends itself.

Until every worker holds its lifeline to rank 0, nothing notices a rank that died: under srun
--kill-on-bad-exit=0 (which lets the job outlive a lost generator) the others would wait in
MPI_Init, or for rank 0's launch plan, until the job's time limit. So a rank gives the start
AREAL_START_TIMEOUT_S seconds (default 900), then prints where it waited and exits 1, a crash
that the batch script requeues. It is read from the environment because it acts before any rank
has the config.
"""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Iterator
from contextlib import contextmanager

from areal_hpc.errors import UserError

START_TIMEOUT_ENV = "AREAL_START_TIMEOUT_S"
DEFAULT_START_TIMEOUT_S = 900.0


def start_timeout_s() -> float:
    raw = os.environ.get(START_TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_START_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < 1e7:  # also nan and inf
        raise UserError(f"{START_TIMEOUT_ENV}={raw!r}: give the seconds a rank waits for the job to start (> 0)")
    return seconds


@contextmanager
def start_deadline(seconds: float) -> Iterator[None]:
    """Past `seconds` inside the block, print every thread's stack (which shows where the rank
    waited) and exit 1. faulthandler's watchdog is a C thread: it fires even while MPI_Init holds
    the interpreter lock."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
