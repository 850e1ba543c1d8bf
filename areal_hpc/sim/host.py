"""Processes sharing too few cores: the CPU profile on a small machine runs more worker processes
(engines, trainer ranks) than it has cores, and then each busy one gets its share of them.

Processor sharing with every busy process at the same rate: while k processes are busy on c cores,
each advances at min(1, c / k) of its own speed. Since every busy process then advances at the
same rate, a run simulated without sharing, on a "work" clock, is the run with sharing on a wall
clock that runs slower while more than c are busy: only the map from work time to wall time
changes. A GPU layout never shares (each rank has its own device); nor does a CPU run with a core
per process, so the fit on such a run is untouched by this model.

Pure: the caller passes the busy spans (work time) of every device with its process count.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable


class SharedHost:
    """The wall clock of a run whose processes share `cores` cores."""

    def __init__(self, cores: int, spans: Iterable[tuple[float, float, float]]) -> None:
        """`spans`: (start, end, processes) of every busy interval, in work time."""
        if cores < 1:
            raise ValueError(f"a host has at least one core, not {cores}")
        changes: dict[float, float] = {}
        for start, end, procs in spans:
            if end > start:
                changes[start] = changes.get(start, 0) + procs
                changes[end] = changes.get(end, 0) - procs
        # Breakpoints in work time, the wall time there, and the slowdown from there on.
        self._work: list[float] = [0.0]
        self._wall: list[float] = [0.0]
        self._slow: list[float] = [1.0]
        busy = 0.0
        for t in sorted(changes):
            busy += changes[t]
            if t <= 0.0:
                self._slow[0] = max(1.0, busy / cores)
                continue
            self._wall.append(self.wall(t))
            self._work.append(t)
            self._slow.append(max(1.0, busy / cores))

    def wall(self, t: float) -> float:
        """Wall-clock time of work time `t`."""
        i = bisect.bisect_right(self._work, t) - 1
        return self._wall[i] + (t - self._work[i]) * self._slow[i]

    def walls(self, spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
        return [(self.wall(a), self.wall(b)) for a, b in spans]
