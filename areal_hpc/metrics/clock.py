"""Busy time of a worker as seen by the controller, for idle fractions over a step."""

from __future__ import annotations


class BusyClock:
    """Accumulates the seconds during which a worker was busy; the caller passes the time."""

    def __init__(self, now: float) -> None:
        self._busy_since: float | None = None
        self._busy_total = 0.0
        self._mark = (now, 0.0)  # (time, busy total) at the last `idle_fraction` call

    @property
    def busy(self) -> bool:
        return self._busy_since is not None

    def set(self, busy: bool, now: float) -> None:
        if busy and self._busy_since is None:
            self._busy_since = now
        elif not busy and self._busy_since is not None:
            self._busy_total += now - self._busy_since
            self._busy_since = None

    def busy_seconds(self, now: float) -> float:
        return self._busy_total + (now - self._busy_since if self._busy_since is not None else 0.0)

    def idle_fraction(self, now: float) -> float:
        """Idle share of the time since the previous call (or since the clock started)."""
        t0, busy0 = self._mark
        busy = self.busy_seconds(now)
        self._mark = (now, busy)
        span = now - t0
        return 0.0 if span <= 0 else min(max(1.0 - (busy - busy0) / span, 0.0), 1.0)
