"""Rank 0's policy as a pure scheduler: events in, commands out.

Everything the controller decides lives here, with no MPI, sockets, files or clocks: which prompt
goes to which generator (admission under the staleness bound), when a batch trains, when weights
move, when an evaluation round or a checkpoint starts, and whether what the generators loaded is
what the trainer sent. The controller rank (runtime/controller_rank.py) turns messages into the event methods below
and executes the commands they return; the cluster simulator (sim/async_system.py) and the
property tests drive this same class, so they check the rule the system runs.

Per event the cost is O(log n) in the prompts in flight (a heap of complete groups, counts per
submission version for the gate) plus O(log G) for the least-loaded generator.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Protocol

from areal_hpc.controller import checkpoint as ckpt
from areal_hpc.controller.buffer import Group, TrajectoryBuffer
from areal_hpc.controller.staleness import StalenessManager
from areal_hpc.data.stream import PromptStream


class Sample(Protocol):
    """What the scheduler reads of a finished sample (a Trajectory message, or a simulated one)."""

    prompt_id: int
    sample_index: int


@dataclass(frozen=True)
class Policy:
    """The parameters of every decision (from the config's rollout, total_steps, eval_interval and
    checkpoint sections; the simulator builds one from its workload)."""

    eta: int
    batch_prompts: int
    group_size: int
    max_concurrent: int
    gate: str
    total_steps: int
    # Evaluate every `eval_interval` versions during training (0: only at the start and the end).
    eval_interval: int = 0
    # Samples per held-out prompt (0: group_size).
    eval_samples: int = 0
    # Checkpoint every `checkpoint_interval` versions (0: only on a signal).
    checkpoint_interval: int = 0
    # Checkpoints of every `hf_interval`-th version and of the last also hold a Hugging Face
    # export (0: none); such a version is checkpointed even off checkpoint_interval.
    hf_interval: int = 0
    # Trainer pipeline stages, each of which reports the checksums of what it sent.
    stages: int = 1
    seed: int = 0
    # Generators the run goes on with; losing more checkpoints and stops for a requeue.
    min_generators: int = 1


# ---- commands ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submit:
    """Send prompt `prompt_id` (data-set row `row`; held-out when prompt_id < 0) to `generator`,
    sampled `group_size` times with `seed`."""

    generator: int
    prompt_id: int
    row: int
    seed: int


@dataclass(frozen=True)
class Train:
    """Train the policy at `version` on these complete groups, oldest first."""

    version: int
    groups: list[Group]


@dataclass(frozen=True)
class SyncWeights:
    """Move `version`'s weights from the trainer to `generators` (the live ones and the joining
    replacements, in rank order) through weight groups number `group`: a new number, and so new
    groups on every side, whenever the members changed or a round of the last groups broke."""

    version: int
    generators: tuple[int, ...]
    group: int = 0


@dataclass(frozen=True)
class Checkpoint:
    """Save `version` now (no step runs; the scheduler's state is `Scheduler.state_dict()`);
    with `hf`, also as a Hugging Face directory."""

    version: int
    hf: bool = False


@dataclass(frozen=True)
class StepFinished:
    """The step trained on `groups` made the policy `version`."""

    version: int
    groups: list[Group]


@dataclass(frozen=True)
class WeightsVerified:
    """`generator` serves `version` with exactly the `tensors` tensors the trainer's stages sent."""

    generator: int
    version: int
    tensors: int


@dataclass(frozen=True)
class SyncFinished:
    """Every generator serves `version`."""

    version: int


@dataclass(frozen=True)
class EvalFinished:
    """Every held-out sample of the round started at `version` came back."""

    version: int
    results: list


Command = Submit | Train | SyncWeights | Checkpoint | StepFinished | WeightsVerified | SyncFinished | EvalFinished


def eval_id(row: int) -> int:
    """The prompt id of held-out row `row`: negative, so it never counts towards staleness."""
    return -1 - row


class WeightMismatch(RuntimeError):
    """A generator loaded tensors that differ from what the trainer sent."""


# ---- the parts ---------------------------------------------------------------------------------


class GeneratorLoad:
    """Prompts in flight per generator; the least loaded one (lowest rank on ties) in O(log G)."""

    def __init__(self, generators: list[int]) -> None:
        if not generators:
            raise ValueError("no generators to schedule on")
        self.load = dict.fromkeys(generators, 0)
        self._heap = [(0, g) for g in sorted(generators)]

    def least_loaded(self) -> int:
        heap = self._heap
        while heap[0][0] != self.load[heap[0][1]]:  # an outdated entry
            heapq.heappop(heap)
        return heap[0][1]

    def add(self, generator: int, delta: int) -> None:
        self.load[generator] += delta
        heapq.heappush(self._heap, (self.load[generator], generator))

    def join(self, generator: int) -> None:
        """`generator` (a replacement) takes work from now on."""
        self.load[generator] = 0
        heapq.heappush(self._heap, (0, generator))

    def remove(self, generator: int) -> None:
        """No more work for `generator` (lost); O(G) once, rebuilding the heap without it."""
        del self.load[generator]
        self._heap = [(n, g) for g, n in self.load.items()]
        heapq.heapify(self._heap)


@dataclass
class EvalRound:
    version: int
    # Samples still to come, per held-out prompt id.
    left: dict[int, int]
    results: list = field(default_factory=list)


@dataclass
class WeightSync:
    """One round of a version's weight update: the generators still to load it, what each stage
    sent, and what failed (a member of the weight group died mid-transfer: the round is done again
    without it once every live party has reported)."""

    waiting: set[int]
    sent: dict[int, dict[str, str]] = field(default_factory=dict)
    # Generators' reports that arrived before every stage's checksums: (generator, checksums).
    loaded: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    failed_stages: int = 0
    errors: list[str] = field(default_factory=list)


# ---- the scheduler -----------------------------------------------------------------------------


class Scheduler:
    def __init__(self, policy: Policy, generators: list[int], train_size: int, held_out_size: int,
                 shuffle: bool = True, state: dict | None = None) -> None:
        p = self.policy = policy
        self.held_out_size = held_out_size
        self.rng = random.Random(p.seed)
        self.stream = PromptStream(train_size, p.seed, shuffle)
        self.sm = StalenessManager(p.eta, p.batch_prompts, p.max_concurrent, p.gate)
        self.buffer = TrajectoryBuffer()
        if state is not None:
            self.sm = StalenessManager.from_state(state["staleness"], p.eta, p.batch_prompts, p.max_concurrent,
                                                  p.gate)
            self.buffer = TrajectoryBuffer.from_state(state["buffer"])
            self.stream.load_state_dict(state["stream"])
            ckpt.set_rng_state(self.rng, state["rng"])
        self.generators = GeneratorLoad(generators)
        self.where: dict[int, Submit] = {}  # prompt id -> how it was submitted, while in flight
        self.served = dict.fromkeys(generators, 0)  # engines start from the model directory
        self.syncs: dict[int, WeightSync] = {}  # version -> its update in flight
        self.step: tuple[int, list[Group]] | None = None  # (version, groups) being trained
        self._gate_closed_at: tuple[int, int] | None = None
        self.eval: EvalRound | None = None
        self.training = False  # training prompts flow only after the start-up eval or sync
        self.ckpt_requested = False
        self.ckpt_in_progress: int | None = None
        self.stop_requested = False
        # Generators lost during the run, in the order they were lost.
        self.lost: list[int] = []
        # Replacements that joined the running job: the next weight update brings them the current
        # version, and once it is verified they are given prompts like any other.
        self.joining: set[int] = set()
        # An update held back behind a broken one (sync_weights).
        self.sync_due = False
        # The weight groups in use (number, members): group 0 of every generator is made at start;
        # a broken round or a lost member retires them (a member's sockets may be gone).
        self.group, self.group_members = 0, tuple(sorted(generators))
        self.group_broken = False
        self.last_ckpt_version = self.version if state is not None else -1

    @property
    def version(self) -> int:
        return self.sm.version

    # ---- queries (for the loop's conditions and clocks) ---------------------------------------

    def finished(self) -> bool:
        """Training is over (or a stop was asked for), and no update or checkpoint is half done:
        a stop never leaves a generator mid-update."""
        if self.ckpt_requested or self.ckpt_in_progress is not None:
            return False
        return (self.stop_requested or self.version >= self.policy.total_steps) and not self.syncs

    def stalled(self) -> str | None:
        """Why training can never go on, or None. Each wait of the loop waits for an event (a
        sample, a step, an update, a checkpoint, an eval round); with none of them pending and no
        batch dispatched, nothing will ever change: a bug, named at once rather than a silent
        hang until the job's time limit."""
        if not self.training or self.finished() or self.stop_requested:
            return None
        if (self.step is not None or self.syncs or self.ckpt_requested or self.ckpt_in_progress is not None
                or self.eval is not None or self.sm.running):
            return None
        needed = self.policy.total_steps * self.policy.batch_prompts
        return (f"at version {self.version} of {self.policy.total_steps} no prompt is in flight and"
                f" {self.buffer.ready} complete of the {self.policy.batch_prompts} a batch needs wait;"
                f" {self.sm.accepted} prompts accepted of the {needed} the run needs")

    @property
    def syncing(self) -> bool:
        return bool(self.syncs)

    @property
    def sending(self) -> bool:
        """Whether a stage has yet to report sending an update: the trainer is in that send (or
        before it), so nothing else it was asked to do has begun."""
        return any(len(s.sent) + s.failed_stages < self.policy.stages for s in self.syncs.values())

    @property
    def trainer_busy(self) -> bool:
        return self.step is not None or bool(self.syncs) or self.ckpt_in_progress is not None

    def hf_due(self, version: int) -> bool:
        """Whether the checkpoint of `version` holds a Hugging Face export: every hf_interval-th
        version and the last one (the run's result)."""
        every = self.policy.hf_interval
        return every > 0 and (version % every == 0 or version >= self.policy.total_steps)

    def generator_busy(self, generator: int) -> bool:
        """Generating with the current weights (not waiting for work or for the update)."""
        return self.generators.load[generator] > 0 and self.served[generator] == self.version

    # ---- commands the loop asks for -----------------------------------------------------------

    def start_training(self) -> None:
        self.training = True

    def request_checkpoint(self, stop: bool = False) -> None:
        """Checkpoint at the next step boundary; with `stop`, then end the run."""
        self.ckpt_requested = True
        self.stop_requested |= stop

    @property
    def alive(self) -> tuple[int, ...]:
        """The generators not lost, in rank order."""
        return tuple(sorted(self.served))

    def sync_weights(self) -> list[Command]:
        """Move the current version's weights to every generator (after a step, and on resume).
        While an update broken by a lost generator waits to be settled, the next one waits too:
        until the loss is known it would go to a group with the dead member again."""
        if any(sync.errors for sync in self.syncs.values()):
            self.sync_due = True
            return []
        members = tuple(sorted(set(self.served) | self.joining))
        if not members:  # every generator lost (the run stops): no weight group of the trainer alone
            self.sync_due = True
            return []
        if members != self.group_members or self.group_broken:
            self.group, self.group_members, self.group_broken = self.group + 1, members, False
        self.syncs[self.version] = WeightSync(set(members))
        return [SyncWeights(self.version, members, self.group)]

    def join_generator(self, generator: int) -> None:
        """A replacement for a lost generator is ready under rank `generator`: it takes part from
        the next weight update on, and is given prompts once it serves a verified version."""
        if generator in self.served or generator in self.joining:
            raise RuntimeError(f"generator rank {generator} joined, but it is in the run already")
        self.joining.add(generator)

    def lose_generator(self, generator: int) -> list[Command]:
        """`generator` is gone (its process or node died). Its prompts in flight go to the others,
        same rows and seeds, their samples so far dropped (so none is lost and none trained twice);
        no update waits for it any more. Below `min_generators` left, a checkpoint at the next step
        boundary and a stop (`stop_requested`), for a requeue that starts every generator again."""
        # Its groups have a dead member: a replacement under the same rank is another process.
        self.group_broken = True
        if generator in self.joining:  # a replacement that never served: no prompt of its to hand on
            self.joining.discard(generator)
            return self._leave_updates(generator)
        if generator not in self.served:
            raise RuntimeError(f"generator rank {generator} lost, but it is not a live generator")
        self.lost.append(generator)
        del self.served[generator]
        self.generators.remove(generator)
        out = self._leave_updates(generator)
        if len(self.served) < self.policy.min_generators:
            self.request_checkpoint(stop=True)
        if not self.served:
            return out  # nothing to give its prompts to: the checkpoint issues them again
        orphans = [s for s in self.where.values() if s.generator == generator]
        if self.eval is not None:
            redo = {s.prompt_id for s in orphans if s.prompt_id < 0}
            k = self.policy.eval_samples or self.policy.group_size
            self.eval.results = [r for r in self.eval.results if r.prompt_id not in redo]
            self.eval.left.update(dict.fromkeys(redo, k))
        for s in orphans:
            if s.prompt_id >= 0:
                self.buffer.restart(s.prompt_id)
            out.append(self._submit(s.prompt_id, s.row, s.seed))
        return out

    def _leave_updates(self, generator: int) -> list[Command]:
        """No update in flight waits for `generator` any more."""
        out: list[Command] = []
        for sync_version in sorted(self.syncs):
            sync = self.syncs[sync_version]
            sync.loaded = [(g, sums) for g, sums in sync.loaded if g != generator]
            if generator in sync.waiting:
                sync.waiting.discard(generator)
                out += self._settle(sync_version)
        return out

    def start_eval(self) -> list[Command]:
        """Sample every held-out prompt `eval_samples` times with the weights of the current version
        (avg@k). The seeds repeat each round, so rounds differ only by the weights."""
        k = self.policy.eval_samples or self.policy.group_size
        self.eval = EvalRound(self.version, {})
        seeds = random.Random(f"eval/{self.policy.seed}")
        out: list[Command] = []
        for row in range(self.held_out_size):
            pid = eval_id(row)
            out.append(self._submit(pid, row, seeds.randrange(2**31)))
            self.eval.left[pid] = k
        return out

    def poll(self) -> list[Command]:
        """What may happen now: a requested checkpoint at a step boundary, admissions, a batch."""
        out: list[Command] = []
        if self.ckpt_requested and self.step is None and self.ckpt_in_progress is None:
            self.ckpt_requested = False
            # Version 0 is the initial model: resuming there is starting afresh.
            if self.version > 0 and self.last_ckpt_version != self.version:
                self.ckpt_in_progress = self.version
                out.append(Checkpoint(self.version, self.hf_due(self.version)))
        if self.training and not self.stop_requested:
            self._admit(out)
            self._dispatch(out)
        return out

    def state_dict(self) -> dict:
        """What a checkpoint of the current version holds; prompts in flight are issued again."""
        return {
            "staleness": self.sm.state_dict(),
            "stream": self.stream.state_dict(reissue=self.buffer.running_ids()),
            "buffer": self.buffer.state_dict(),
            "rng": ckpt.rng_state(self.rng),
        }

    # ---- events -------------------------------------------------------------------------------

    def on_trajectory(self, sample: Sample) -> list[Command]:
        if sample.prompt_id < 0:
            return self._on_eval_sample(sample)
        if self.buffer.add(sample) is not None:
            self.sm.accept()
            self.generators.add(self.where.pop(sample.prompt_id).generator, -1)
        return []

    def on_step_done(self, version: int) -> list[Command]:
        if self.step is None or version != self.step[0] + 1:
            raise RuntimeError(f"StepDone for version {version} but no such step was running")
        _, groups = self.step
        self.step = None
        self.sm.set_version(version)
        every = self.policy.checkpoint_interval
        if (every and version % every == 0) or self.hf_due(version):
            self.ckpt_requested = True
        return [StepFinished(version, groups), *self.sync_weights()]

    def on_weights_sent(self, stage: int, version: int, checksums: dict[str, str],
                        error: str | None = None) -> list[Command]:
        """Stage `stage` sent `version` (or failed to: `error`)."""
        sync = self._sync(version)
        if error is not None:
            sync.failed_stages += 1
            sync.errors.append(f"stage {stage}: {error}")
            return self._settle(version)
        sync.sent[stage] = checksums
        if len(sync.sent) < self.policy.stages:
            return []
        out: list[Command] = []
        for generator, sums in sync.loaded:
            out += self._verify(version, generator, sums)
        sync.loaded.clear()
        return out + self._settle(version)

    def on_weights_loaded(self, generator: int, version: int, checksums: dict[str, str],
                          error: str | None = None) -> list[Command]:
        """`generator` loaded `version` (or its transfer broke: `error`; it serves what it had)."""
        sync = self._sync(version)
        if error is not None:
            if generator not in sync.waiting:
                raise RuntimeError(f"generator rank {generator} reported version {version} twice")
            sync.waiting.discard(generator)
            sync.errors.append(f"generator rank {generator}: {error}")
            return self._settle(version)
        if len(sync.sent) < self.policy.stages:
            sync.loaded.append((generator, checksums))
            return self._settle(version)
        return self._verify(version, generator, checksums) + self._settle(version)

    def on_checkpoint_saved(self) -> None:
        if self.ckpt_in_progress is None:
            raise RuntimeError("CheckpointSaved but no checkpoint was being saved")
        self.last_ckpt_version = self.ckpt_in_progress
        self.ckpt_in_progress = None

    def on_checkpoint_skipped(self) -> None:
        """The checkpoint asked for was not written (no room for it): the run goes on, and the
        last complete one stays the point a restart resumes from."""
        if self.ckpt_in_progress is None:
            raise RuntimeError("a checkpoint skipped but none was being saved")
        self.ckpt_in_progress = None

    # ---- inside -------------------------------------------------------------------------------

    def _submit(self, prompt_id: int, row: int, seed: int) -> Submit:
        generator = self.generators.least_loaded()
        self.generators.add(generator, 1)
        submit = self.where[prompt_id] = Submit(generator, prompt_id, row, seed)
        return submit

    def _admit(self, out: list[Command]) -> None:
        """Submit prompts while the staleness bound allows and later steps still need them."""
        needed = self.policy.total_steps * self.policy.batch_prompts
        sm = self.sm
        while sm.capacity() > 0 and sm.accepted + sm.running < needed:
            pid = self.stream.next()
            out.append(self._submit(pid, self.stream.index(pid), self.rng.randrange(2**31)))
            self.buffer.open(pid, self.version, self.policy.group_size)
            sm.submit()

    def _dispatch(self, out: list[Command]) -> None:
        """Hand the oldest complete groups to the trainer when a batch may train."""
        b = self.policy.batch_prompts
        # Not while a checkpoint is asked for or being saved: its state (taken when the loop
        # executes the Checkpoint) must still hold the next batch, which is trained after it.
        if (self.step is not None or self.version >= self.policy.total_steps or self.ckpt_requested
                or self.ckpt_in_progress is not None):
            return
        if self.buffer.ready < b:
            return
        # The gate only changes with the buffer's counts or the version: a closed gate is not
        # recomputed on every sample of every poll.
        key = (self.buffer.revision, self.version)
        if key == self._gate_closed_at:
            return
        if not self.sm.may_train(self.buffer.running_versions, self.buffer.ready_versions):
            self._gate_closed_at = key
            return
        groups = self.buffer.pop_batch(b)
        self.step = (self.version, groups)
        out.append(Train(self.version, groups))

    def _sync(self, version: int) -> WeightSync:
        sync = self.syncs.get(version)
        if sync is None:
            raise RuntimeError(f"weights of version {version} reported, but no such update is in flight")
        return sync

    def _verify(self, version: int, generator: int, loaded: dict[str, str]) -> list[Command]:
        sync = self.syncs[version]
        sent = {name: digest for sums in sync.sent.values() for name, digest in sums.items()}
        bad = sorted(k for k in sent.keys() | loaded.keys() if sent.get(k) != loaded.get(k))
        if bad:
            raise WeightMismatch(
                f"generator rank {generator} loaded version {version} with {len(bad)} tensor(s) differing"
                f" from what the trainer sent: {', '.join(bad[:5])}"
            )
        if generator not in sync.waiting:
            raise RuntimeError(f"generator rank {generator} reported version {version} twice")
        sync.waiting.discard(generator)
        if generator in self.joining:
            self.joining.discard(generator)
            self.generators.join(generator)
        self.served[generator] = version
        return [WeightsVerified(generator, version, len(sent))]

    def _settle(self, version: int) -> list[Command]:
        """Once every stage and every live generator reported this round: the update is done, or,
        when a part failed, sent again to the generators alive now (in new weight groups). Until
        then a generator whose transfer broke serves the weights it had, part old, part new; its
        samples carry their own log-probs, so the decoupled objective stays exact."""
        sync = self.syncs.get(version)
        if sync is None:  # already settled
            return []
        unverified = {g for g, _ in sync.loaded}
        if len(sync.sent) + sync.failed_stages < self.policy.stages or sync.waiting - unverified:
            return []
        if not sync.errors:
            return self._sync_finished(version)
        del self.syncs[version]
        self.group_broken = True
        # The current version's update, now to the live generators, only while it is the
        # trainer's next command: with a step training, that step's update comes next instead.
        due, self.sync_due = self.sync_due, False
        if not self.served or self.step is not None or (version < self.version and not due):
            return []
        return self.sync_weights()

    def _sync_finished(self, version: int) -> list[Command]:
        del self.syncs[version]
        out: list[Command] = [SyncFinished(version)]
        every = self.policy.eval_interval
        due = every and version % every == 0 and version < self.policy.total_steps
        if due and self.eval is None and self.served:  # none served: nobody to sample it
            out += self.start_eval()
        return out

    def _on_eval_sample(self, sample: Sample) -> list[Command]:
        ev = self.eval
        if ev is None or ev.left.get(sample.prompt_id, 0) < 1:
            raise RuntimeError(f"unexpected held-out result for prompt {sample.prompt_id}")
        ev.left[sample.prompt_id] -= 1
        ev.results.append(sample)
        if ev.left[sample.prompt_id] == 0:
            del ev.left[sample.prompt_id]
            self.generators.add(self.where.pop(sample.prompt_id).generator, -1)
        if ev.left:
            return []
        self.eval = None
        return [EvalFinished(ev.version, ev.results)]

