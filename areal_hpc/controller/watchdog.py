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

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class Verdict:
    """What rank 0 does about the operations past their deadlines."""

    drop: dict[int, str] = field(default_factory=dict)  # generator rank -> why, for the log
    restart: tuple[Overdue, ...] = ()  # clocks that start again: those waiting on the dropped
    fatal: str | None = None  # the job ends with this message


def judge(late: list[Overdue], generators: Mapping[str, int], waiting: Collection[int],
          culprits: Mapping[int, int], sending: bool, alive: Collection[int], min_generators: int,
          loading: Collection[int] = ()) -> Verdict:
    """Who is to blame for `late`, given the generators by name (the live and joining ones), the
    members of an update that took it up and are not stranded by a loss (`waiting`), the live
    members that never took up theirs (`culprits`: rank -> version), those of them still loading
    an update queued before it (`loading`: not hung, unless their own clocks say so) and whether
    the trainer is still sending an update (`sending`).

    A generator past its deadline is dropped, as a dead one is, while `min_generators` are left.
    Members that took an update up wait on the culprits: they are kept and their clocks start
    again (the culprits' own clocks fire next). So is the trainer when it is past a deadline
    while still sending to culprits (its next step or checkpoint has not begun): the culprits are
    dropped then, though their own clocks may be far from their deadlines (the first update's is
    `first_s`). Anything else ends the job: the trainer hung, an update every member took up (a
    transport hang), or too few generators left."""
    overdue = {generators[o.who]: o for o in late if o.who in generators}
    trainer = [o for o in late if o.who not in generators]
    waits = [o for g, o in overdue.items() if o.op == WEIGHT_UPDATE and g in waiting]
    drop = {g: f"hung: {o.describe()}" for g, o in overdue.items() if not (o.op == WEIGHT_UPDATE and g in waiting)}
    if trainer and sending and culprits:
        name = {g: who for who, g in generators.items()}
        for g, version in culprits.items():
            if g in loading:
                continue
            drop.setdefault(g, f"hung: {name[g]}: never took up the weight update to version {version},"
                               f" which the trainer waits to send ({trainer[0].describe()})")
        waits, trainer = waits + trainer, []
    everything = "hung: " + "; ".join([o.describe() for o in late]
                                      + [why.removeprefix("hung: ") for g, why in drop.items() if g not in overdue])
    if not drop:
        return Verdict(restart=tuple(waits)) if waits and culprits and not trainer else Verdict(fatal=everything)
    if trainer or len([g for g in alive if g not in drop]) < min_generators:
        return Verdict(fatal=everything)
    return Verdict(drop=drop, restart=tuple(waits))


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
        self._paused: set[int] = set()  # took an update up (its latest or one queued before) and is loading it

    def sent(self, generator: int, version: int) -> None:
        self._version[generator] = version
        self._begun.discard(generator)

    def begun(self, generator: int, version: int) -> None:
        if generator in self._version:
            self._paused.add(generator)
        if self._version.get(generator) == version:
            self._begun.add(generator)

    def loaded(self, generator: int, version: int) -> int | None:
        """`generator` reported `version` loaded (or broken): the version of the update it is still
        in, None when that was its latest."""
        self._paused.discard(generator)
        latest = self._version.get(generator)
        if latest is None or latest == version:
            self._version.pop(generator, None)
            return None
        return latest

    def drop(self, generator: int) -> None:
        self._version.pop(generator, None)
        self._begun.discard(generator)
        self._paused.discard(generator)

    def paused(self, generator: int) -> bool:
        """Whether `generator` took an update up and has not reported it loaded: it generates
        nothing until then. One sent an update it has not read yet is still generating."""
        return generator in self._paused

    def version(self, generator: int) -> int | None:
        """The version of the update `generator` is in, None when it is in none."""
        return self._version.get(generator)

    def took_up(self, generator: int) -> bool:
        return generator in self._begun

    def not_begun(self, generators) -> list[int]:
        """Those of `generators` in an update they have not taken up: what its members wait on."""
        return [g for g in generators if g in self._version and g not in self._begun]
