"""Fault injection for resilience tests: make one rank fail or hang at a chosen point of a real run.

AREAL_HPC_FAULT=<role>:<index>:<event> (e.g. "trainer:0:step", "generator:0:request") makes
that rank raise InjectedFault the first time it reaches the event; with a ":stall" suffix
(e.g. "generator:1:join:stall") the rank stops there forever instead, as a hung process would;
with ":kill" it dies there by SIGKILL, as the out-of-memory killer would kill it. `<event>@<n>`
(e.g. "generator:1:update@6:kill") waits for the event's n-th time, so a rank can fail mid-run.
Several faults are separated by commas ("generator:1:request@3,generator:2:update@2:stall"), so
one run can lose several ranks, each its own way.
Events that are not a point of failure ("generator:0:checksum": report a wrong checksum of one
received tensor) are asked with `requested`. Unset, nothing happens. It exercises the real failure paths (WorkerFailed, the startup timeout,
rank 0's report, MPI abort) of a real job.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from dataclasses import dataclass

ENV = "AREAL_HPC_FAULT"


class InjectedFault(RuntimeError):
    """Raised on purpose, as requested by AREAL_HPC_FAULT."""


MODES = ("raise", "stall", "kill")
# Times this process reached each event ("role:index:event"), for `<event>@<n>`.
_reached: Counter[str] = Counter()


@dataclass(frozen=True)
class Fault:
    point: str  # "role:index:event"
    nth: int | None  # None: every time
    mode: str


def parse(spec: str) -> Fault:
    """The fault AREAL_HPC_FAULT asks for; a malformed one is named rather than never firing."""
    parts = spec.split(":")
    mode = parts.pop() if len(parts) == 4 else "raise"
    if len(parts) != 3 or mode not in MODES or not parts[1].isdigit():
        raise ValueError(f"{ENV}={spec!r}: expected <role>:<index>:<event>[@<n>][:stall|:kill]")
    event, at, nth = parts[2].partition("@")
    if at and not (nth.isdigit() and int(nth) >= 1):
        raise ValueError(f"{ENV}={spec!r}: @{nth} must be a count >= 1")
    return Fault(f"{parts[0]}:{parts[1]}:{event}", int(nth) if at else None, mode)


def parse_all(spec: str) -> list[Fault]:
    """Every fault of a comma-separated AREAL_HPC_FAULT."""
    return [parse(one) for one in spec.split(",")]


def _due(role: str, index: int, event: str, mode: str | None) -> Fault | None:
    """The requested fault if this reach of the event is the one it names (counting the reach)."""
    spec = os.environ.get(ENV)
    if not spec:
        return None
    point = f"{role}:{index}:{event}"
    _reached[point] += 1
    for f in parse_all(spec):
        if f.point == point and (mode is None or f.mode == mode) and f.nth in (None, _reached[point]):
            return f
    return None


def requested(role: str, index: int, event: str) -> bool:
    return _due(role, index, event, "raise") is not None


def check(role: str, index: int, event: str) -> None:
    f = _due(role, index, event, None)
    if f is None:
        return
    if f.mode == "raise":
        raise InjectedFault(f"fault injected at {event} ({ENV}={os.environ[ENV]})")
    if f.mode == "stall":
        while True:  # hung: only the job's end (rank 0's abort) stops it
            time.sleep(60)
    os.kill(os.getpid(), signal.SIGKILL)
