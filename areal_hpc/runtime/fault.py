"""Fault injection for resilience tests: make one rank raise at a chosen point of a real run.

AREAL_HPC_FAULT=<role>:<index>:<event> (e.g. "trainer:0:step", "generator:0:request") makes
that rank raise InjectedFault the first time it reaches the event; unset, nothing happens. It
exercises the real failure path (WorkerFailed, rank 0's report, MPI abort) of a real job.
"""

from __future__ import annotations

import os

ENV = "AREAL_HPC_FAULT"


class InjectedFault(RuntimeError):
    """Raised on purpose, as requested by AREAL_HPC_FAULT."""


def check(role: str, index: int, event: str) -> None:
    if os.environ.get(ENV) == f"{role}:{index}:{event}":
        raise InjectedFault(f"fault injected at {event} ({ENV}={os.environ[ENV]})")
