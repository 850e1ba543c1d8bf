"""Deadlines on the operations that can hang after start-up: a training step, a weight update on
each generator, a checkpoint, and a generator's progress while it has prompts in flight.

Pure: the caller passes the time. A deadline is the configured seconds (config/schema.py
WatchdogConfig), or, when that is 0
(automatic), `factor` times the longest completed run of that operation so far, at least `min_s`;
before any has completed it is `first_s` (the first step compiles, the first update connects).
So a deadline follows the run's own pace: a step that takes 10 minutes at the paper's scale is not
called hung, and one that stops is named within a few of its own durations.
"""

from __future__ import annotations

from dataclasses import dataclass

from areal_hpc.config.schema import WatchdogConfig

# The operations watched, with what the message says the rank was doing.
TRAIN_STEP = "train_step"
WEIGHT_UPDATE = "weight_update"
CHECKPOINT = "checkpoint"
GENERATION = "generation"
DOING = {
    TRAIN_STEP: "training step",
    WEIGHT_UPDATE: "loading the weights of",
    CHECKPOINT: "saving checkpoint",
    GENERATION: "generating (no sample came back) for",
}


@dataclass(frozen=True)
class Overdue:
    op: str
    # Who ("the trainer", "rank 5 (generator 1)") and on what ("for version 3", "version 4").
    who: str
    what: str
    elapsed_s: float
    deadline_s: float

    def describe(self) -> str:
        return (f"{self.who}: {DOING[self.op]} {self.what} has taken {self.elapsed_s:.0f} s, past its deadline of"
                f" {self.deadline_s:.0f} s (watchdog.{self.op}_s)")


class Watchdog:
    def __init__(self, limits: WatchdogConfig) -> None:
        self.limits = limits
        self._started: dict[tuple[str, str], tuple[str, float]] = {}  # (op, who) -> (what, since)
        self._longest: dict[str, float] = {}

    def deadline(self, op: str) -> float:
        explicit = getattr(self.limits, f"{op}_s")
        if explicit > 0:
            return explicit
        if op not in self._longest:
            return self.limits.first_s
        return max(self.limits.min_s, self.limits.factor * self._longest[op])

    def start(self, op: str, who: str, what: str, now: float) -> None:
        self._started[(op, who)] = (what, now)

    def start_if_idle(self, op: str, who: str, what: str, now: float) -> None:
        if (op, who) not in self._started:
            self.start(op, who, what, now)

    def finish(self, op: str, who: str, now: float) -> None:
        """The operation ended (an unknown one is ignored: it was never started or already ended)."""
        got = self._started.pop((op, who), None)
        if got is not None:
            self._longest[op] = max(self._longest.get(op, 0.0), now - got[1])

    def cancel(self, op: str, who: str) -> None:
        """Stop watching without counting it as a completed run (a generator paused for an update)."""
        self._started.pop((op, who), None)

    def progress(self, op: str, who: str, what: str, now: float) -> None:
        """A continuing operation made progress: its clock restarts (a generation's samples)."""
        self.finish(op, who, now)
        self.start(op, who, what, now)

    def overdue(self, now: float) -> list[Overdue]:
        out = []
        for (op, who), (what, since) in self._started.items():
            limit = self.deadline(op)
            if now - since > limit:
                out.append(Overdue(op, who, what, now - since, limit))
        return out


class UpdateMembers:
    """Which weight update each generator is in, and whether it took it up (UpdateBegun).

    Updates queue on a generator: a step can finish, and its update be sent, before the previous
    update reached every member. So every report names its version, and only the latest update's
    count: a member that loaded an older one is now in the next (its clock starts again), and its
    UpdateBegun of an older one does not make it a member that took the latest up. Without the
    versions, one member's older load stopped the clock of the update it then hung in, and the
    run waited on it until the train step's deadline (seen in CI)."""

    def __init__(self) -> None:
        self._version: dict[int, int] = {}  # generator rank -> version of the update it is in
        self._begun: set[int] = set()

    def sent(self, generator: int, version: int) -> None:
        self._version[generator] = version
        self._begun.discard(generator)

    def begun(self, generator: int, version: int) -> None:
        if self._version.get(generator) == version:
            self._begun.add(generator)

    def loaded(self, generator: int, version: int) -> int | None:
        """`generator` reported `version` loaded (or broken): the version of the update it is still
        in, None when that was its latest."""
        latest = self._version.get(generator)
        if latest is None or latest == version:
            self._version.pop(generator, None)
            return None
        return latest

    def drop(self, generator: int) -> None:
        self._version.pop(generator, None)
        self._begun.discard(generator)

    def version(self, generator: int) -> int | None:
        """The version of the update `generator` is in, None when it is in none."""
        return self._version.get(generator)

    def took_up(self, generator: int) -> bool:
        return generator in self._begun

    def not_begun(self, generators) -> list[int]:
        """Those of `generators` in an update they have not taken up: what its members wait on."""
        return [g for g in generators if g in self._version and g not in self._begun]
