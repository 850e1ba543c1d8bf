"""Fault injection for resilience tests: make one rank fail or hang at a chosen point of a real run.

AREAL_HPC_FAULT=<role>:<index>:<event> (e.g. "trainer:0:step", "generator:0:request") makes
that rank raise InjectedFault the first time it reaches the event; with a ":stall" suffix
(e.g. "generator:1:join:stall") the rank stops there forever instead, as a hung process would;
with ":kill" it dies there by SIGKILL, as the out-of-memory killer would kill it.
Events that are not a point of failure ("generator:0:checksum": report a wrong checksum of one
received tensor) are asked with `requested`. Unset, nothing happens. It exercises the real failure paths (WorkerFailed, the startup timeout,
rank 0's report, MPI abort) of a real job.
"""

from __future__ import annotations

import os
import signal
import time

ENV = "AREAL_HPC_FAULT"


class InjectedFault(RuntimeError):
    """Raised on purpose, as requested by AREAL_HPC_FAULT."""


def requested(role: str, index: int, event: str) -> bool:
    return os.environ.get(ENV) == f"{role}:{index}:{event}"


def check(role: str, index: int, event: str) -> None:
    spec = os.environ.get(ENV)
    point = f"{role}:{index}:{event}"
    if spec == point:
        raise InjectedFault(f"fault injected at {event} ({ENV}={spec})")
    if spec == f"{point}:stall":
        while True:  # hung: only the job's end (rank 0's abort) stops it
            time.sleep(60)
    if spec == f"{point}:kill":
        os.kill(os.getpid(), signal.SIGKILL)
