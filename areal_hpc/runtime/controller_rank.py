"""Rank 0's event loop: the I/O around the scheduler (scheduler.py), which makes every decision.

The loop never blocks on one worker: each turn it drains every message that has arrived, hands
each to the scheduler as an event, then asks the scheduler what may happen now (admissions, a
batch, a checkpoint) and executes the commands: messages to the workers, the metrics, the ledger,
checkpoint files. It also owns what needs a clock, signals or sockets: step timing, busy clocks,
SIGUSR1/SIGTERM, the lifelines and the start-up wait. Bulk tensors go through the weight groups,
never through here.

Held-out prompts are evaluated through the same generators under negative prompt ids
(-1 - row), so they never enter the staleness count or the buffer.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from areal_hpc.config.load import save_config
from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.controller import checkpoint as ckpt
from areal_hpc.controller.buffer import trainable
from areal_hpc.controller.scheduler import (
    Checkpoint,
    Command,
    EvalFinished,
    Policy,
    Scheduler,
    StepFinished,
    Submit,
    SyncFinished,
    SyncWeights,
    Train,
    WeightsVerified,
)
from areal_hpc.controller.watchdog import (
    CHECKPOINT,
    GENERATION,
    TRAIN_STEP,
    WEIGHT_UPDATE,
    Overdue,
    UpdateMembers,
    Watchdog,
    judge,
)
from areal_hpc.evaluation.metrics import ks_for, pass_at_k
from areal_hpc.metrics import report
from areal_hpc.metrics.batch import accuracy, batch_stats, source_stats
from areal_hpc.metrics.clock import BusyClock
from areal_hpc.metrics.jsonl import read_records, rewrite_records
from areal_hpc.metrics.progress import Progress
from areal_hpc.metrics.writer import MetricsWriter
from areal_hpc.runtime.failure import abort_job, describe
from areal_hpc.runtime.preflight import Prompts
from areal_hpc.runtime.replacements import Replacements
from areal_hpc.runtime.trainer_commands import TrainerCommands
from areal_hpc.trainer.hf_checkpoint import write_tokenizer
from areal_hpc.wire.layout import generator_ranks, role_of
from areal_hpc.wire.lifeline import LifelineServer
from areal_hpc.wire.link import Hub
from areal_hpc.wire.messages import (
    CheckpointSaved,
    GenerateRequest,
    JoinOffer,
    LaunchPlan,
    SamplingParams,
    SaveCheckpoint,
    Shutdown,
    StepDone,
    Trajectory,
    UpdateBegun,
    UpdateWeights,
    WeightGroupAddress,
    WeightsLoaded,
    WeightsSent,
    WorkerFailed,
    WorkerReady,
)
from areal_hpc.wire.transport import POLL_S, Channel

log = logging.getLogger(__name__)
LEDGER_FILE = "ledger.jsonl"
WEIGHTS_FILE = "weights.jsonl"
# Seconds rank 0 watches the lifelines after a worker reports an error, for a dead peer behind it.
DEAD_PEER_GRACE_S = 1.0
# Seconds a broken weight update waits for the generator whose loss explains it: a dead one's
# lifeline ends at once, a failing one reports after its engine stopped (runtime/failure.py).
BROKEN_UPDATE_GRACE_S = 30.0
# Seconds a hung generator has to leave once rank 0 cut its lifeline; a process that does not (its
# watching thread cannot run) ends the job, as a hang did before it could be survived.
CUT_GRACE_S = 30.0
# Seconds between two looks at the watchdog's deadlines.
WATCHDOG_EVERY_S = 1.0
TRAINER = "the trainer"
# Rank 0's exit status after losing generators below rollout.min_generators: its checkpoint is
# saved and a requeue (slurm/hetjob.sh.in) starts every generator again.
LOST_GENERATORS_EXIT = 3


def policy_of(cfg: ExperimentConfig) -> Policy:
    r = cfg.rollout
    return Policy(r.eta, r.batch_prompts, r.group_size, r.max_concurrent, r.staleness_gate, cfg.total_steps,
                  eval_interval=cfg.eval_interval, eval_samples=cfg.eval.n or 0, checkpoint_interval=cfg.checkpoint.interval_steps,
                  hf_interval=cfg.checkpoint.hf_interval, stages=cfg.trainer.pp, seed=cfg.seed,
                  min_generators=r.min_generators)


@dataclass
class StepTiming:
    """What rank 0 measured of the step in flight: its batch's statistics and when it was sent."""

    stats: dict[str, float]
    dispatched_at: float


class Controller:
    def __init__(self, plan: LaunchPlan, prompts: Prompts, chan: Channel, lifelines: LifelineServer) -> None:
        cfg: ExperimentConfig = plan.config
        self.cfg, self.plan, self.prompts, self.lifelines = cfg, plan, prompts, lifelines
        # The MPI world, and the links of replacement generators that joined it (wire/link.py).
        self.chan = Hub(chan)
        self.run_dir = Path(cfg.logging.dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.trainers = TrainerCommands(chan, cfg)
        self.replacements = Replacements(self.run_dir, lifelines, plan)
        # Replacements offered a lost generator's rank, until they serve: rank -> when offered.
        self.joiners: dict[int, float] = {}
        self.generators = generator_ranks(cfg)
        # Samples each generator rank sent (a replacement's counted from when it serves).
        self.samples: dict[int, int] = dict.fromkeys(self.generators, 0)
        self.replaced: set[int] = set()
        self.counters: dict[str, float] = {"elapsed_s": 0.0, "trained_tokens": 0.0, "generated_tokens": 0.0}
        self.resumed = plan.resume_dir is not None
        self.model_dir = Path(plan.model_dir)
        state = None
        if self.resumed:
            saved = ckpt.ControllerState.load(plan.resume_dir)
            state = {"staleness": saved.staleness, "stream": saved.stream, "buffer": saved.buffer, "rng": saved.rng}
            self.counters.update(saved.counters)
        else:
            for old in ckpt.discard_all(ckpt.root_dir(cfg)):
                log.warning("starting afresh: removed checkpoint %s of an earlier run", old)
        self.sched = Scheduler(policy_of(cfg), self.generators, len(prompts.train), len(prompts.held_out),
                               cfg.data.shuffle, state)
        self.total = cfg.total_steps
        self._truncate_logs()
        self.metrics = MetricsWriter(self.run_dir, cfg.logging.tensorboard, resume_step=self.sched.version,
                                     experiment=cfg)
        self.progress = Progress(self.total, self.sched.version, cfg.logging.progress)
        self.step: StepTiming | None = None
        self.sync_started: dict[int, float] = {}  # version -> when its update (this round) was asked for
        self.lost_at: dict[int, float] = {}  # lost generator rank -> when its loss was seen
        self.loss_times: list[float] = []  # when each generator loss was seen, replaced or not
        self.leaving: dict[int, float] = {}  # hung generator rank, its lifeline cut -> when
        self.updates = UpdateMembers()  # the update each generator is in, and whether it took it up
        self.ready = False  # every worker reported ready; from then on a lost generator is survived
        # Broken weight updates not yet explained by a lost generator: (deadline, round start, what).
        self.unexplained: list[tuple[float, float, str]] = []
        # Pause-to-resume seconds each generator reported, until its load is verified.
        self.sync_seconds: dict[tuple[int, int], float] = {}
        # Seconds of the latest completed weight update (trainer send to the last generator loaded).
        self.last_sync_s: float | None = None
        self.ckpt_path: Path | None = None
        self.ckpts_skipped: list[int] = []  # versions whose checkpoint found no room
        self.step_gen_tokens = 0.0
        # The generators' engine step-time sums (WeightsLoaded.engine_stats) since the last record.
        self.step_engine_stats: dict[str, float] = {}
        self.now = time.monotonic()
        self.last_step_at = self.now
        self.trainer_clock = BusyClock(self.now)
        self.gen_clocks = {g: BusyClock(self.now) for g in self.generators}
        self.watchdog = Watchdog(cfg.watchdog)
        self.watched_at = self.now

    @property
    def version(self) -> int:
        return self.sched.version

    # ---- the loop -------------------------------------------------------------------------

    def run(self) -> int:
        signal.signal(signal.SIGUSR1, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        self._wait_ready()
        self.now = time.monotonic()
        if self.resumed:
            self.progress.note(f"resumed from version {self.version} ({self.sched.sm.accepted} prompts accepted)")
            self._execute(self.sched.sync_weights())
            self._until(lambda: not self.sched.syncing)
        else:
            self._execute(self.sched.start_eval())
            self._until(lambda: self.sched.eval is None)
        self.last_step_at = self.now
        self.sched.start_training()
        for clock in (self.trainer_clock, *self.gen_clocks.values()):
            clock.idle_fraction(self.now)
        self._until(self.sched.finished)
        if self.sched.stop_requested and len(self.sched.alive) < self.cfg.rollout.min_generators:
            self.progress.note(f"stopped at version {self.version} with {len(self.sched.alive)} generator(s) left, fewer"
                               f" than rollout.min_generators = {self.cfg.rollout.min_generators}; checkpoint saved,"
                               f" exit {LOST_GENERATORS_EXIT} for a requeue")
            return self._shutdown("too few generators left", LOST_GENERATORS_EXIT)
        if self.sched.stop_requested:
            self.progress.note(f"stopped on request at version {self.version}; checkpoint saved")
            return self._shutdown("stopped on signal", 0)
        self._until(lambda: self.sched.eval is None)  # one started during training
        self._execute(self.sched.start_eval())
        self._until(lambda: self.sched.eval is None)
        return self._shutdown("done", 0)

    def _until(self, done) -> None:
        """Run turns of the loop until `done()`."""
        while not done():
            worked = self._turn()
            if not worked:
                time.sleep(POLL_S)

    def _turn(self) -> bool:
        self.now = time.monotonic()
        self._check_lifelines()
        if self.ready:
            self._check_replacements()
        if self.unexplained:
            self._check_unexplained()
        if self.leaving:
            self._check_leaving()
        worked = False
        while (got := self.chan.poll()) is not None:
            self._handle(*got)
            worked = True
        self.now = time.monotonic()
        commands = self.sched.poll()
        self._execute(commands)
        if not commands and (why := self.sched.stalled()):
            abort_job(self.chan.comm, f"the scheduler stalled (a bug of areal-hpc): {why}")
        self._update_clocks()
        if self.now - self.watched_at >= WATCHDOG_EVERY_S:
            self.watched_at = self.now
            late = self.watchdog.overdue(self.now)
            if late:
                self._on_overdue(late)
        return worked or bool(commands)

    def _on_signal(self, signum: int, _frame) -> None:
        """SIGUSR1: checkpoint at the next step boundary and go on; SIGTERM: checkpoint and stop."""
        self.sched.request_checkpoint(stop=signum == signal.SIGTERM)

    # ---- startup --------------------------------------------------------------------------

    def _wait_ready(self) -> None:
        """Relay the weight groups' addresses to the generators until every worker is ready; a
        worker not ready within `startup_timeout_s` is named and the job ends."""
        waiting = set(range(1, self.chan.size))
        announced: set[int] = set()  # stage leaders waiting in their weight group for the generators
        deadline = time.monotonic() + self.cfg.startup_timeout_s
        while waiting:
            self._check_lifelines()
            got = self.chan.poll()
            if got is None:
                if time.monotonic() > deadline:
                    abort_job(self.chan.comm, self._not_ready(waiting, announced))
                time.sleep(POLL_S)
                continue
            src, msg = got
            if isinstance(msg, WeightGroupAddress):
                announced.add(src)
                self._relay(msg)
            elif isinstance(msg, WorkerReady):
                waiting.discard(msg.rank)
            else:
                self._handle(src, msg)
        self.ready = True
        self.progress.note(f"all {self.chan.size - 1} workers ready")

    def _not_ready(self, waiting: set[int], announced: set[int]) -> str:
        why = []
        for rank in sorted(waiting):
            role, index = role_of(self.cfg, rank)
            if rank in self.generators:
                doing = "never joined the weight groups (engine start, model load or the group join)"
            elif rank in announced:
                doing = "waits in its weight group for generators that never joined"
            else:
                doing = "did not load its model and join the trainer group"
            why.append(f"rank {rank} ({role} {index}) {doing}")
        return f"not ready after startup_timeout_s = {self.cfg.startup_timeout_s:g} s: " + "; ".join(why)

    def _check_lifelines(self) -> None:
        """A worker whose lifeline ended died without reporting (kill -9, the OOM killer, a lost
        node). A generator, once every worker was ready, is dropped and the run goes on without
        it; any other rank is named and the job ends."""
        dead = self._dead()
        if not dead:
            return
        if not self.ready or any(rank not in self.sched.alive and rank not in self.joiners for rank in dead):
            abort_job(self.chan.comm, "; ".join(self._died(rank) for rank in dead))
        for rank in dead:
            self._lose(rank, self._died(rank))

    def _on_overdue(self, late: list[Overdue]) -> None:
        """Drop the hung generators (controller/watchdog.py judge says which), or end the job. A
        dropped one goes the way of a dead one: rank 0 cuts its lifeline, on which the rank's
        watching thread ends its process (wire/lifeline.py), and the transfer it broke is
        reported and done again. A member still in a transfer that a lost generator broke is
        stranded, not waiting: its broadcast relays through peers that gave up."""
        names = {self._name(g): g for g in (*self.sched.alive, *self.sched.joining)}
        waiting = [g for g in names.values() if self.updates.took_up(g)
                   and not self._lost_since(self.sync_started.get(self.updates.version(g), math.inf))]
        culprits = {g: self.updates.version(g) for g in self.updates.not_begun(self.sched.alive)}
        verdict = judge(late, names, waiting, culprits, self.sched.sending, self.sched.alive,
                        self.cfg.rollout.min_generators, [g for g in culprits if self.updates.paused(g)])
        if verdict.fatal is not None:
            abort_job(self.chan.comm, verdict.fatal)
        for rank, why in verdict.drop.items():
            self.lifelines.cut(rank)
            self.leaving[rank] = self.now
            self._lose(rank, why)
        for o in verdict.restart:
            self.watchdog.start(o.op, o.who, o.what, self.now)

    def _dead(self) -> list[int]:
        """Ranks whose lifeline (or a replacement's link) ended since the last look, but for
        generators already lost."""
        ended = sorted({*self.lifelines.ended(), *self.chan.closed()})
        for rank in ended:
            self.leaving.pop(rank, None)
        return [rank for rank in ended if rank not in self.lost_at]

    def _check_leaving(self) -> None:
        stuck = [rank for rank, at in self.leaving.items() if self.now - at > CUT_GRACE_S]
        if stuck:
            abort_job(self.chan.comm, "; ".join(f"{self._name(r)} hung and did not leave within {CUT_GRACE_S:g} s"
                                                 " of being dropped from the run" for r in stuck))

    def _lose(self, rank: int, why: str) -> None:
        """Go on without generator `rank`: the scheduler hands its prompts to the others and the
        next weight update rebuilds the weight groups without it."""
        log.warning("%s; going on without it", why)
        self.lost_at[rank] = time.monotonic()
        self.loss_times.append(self.lost_at[rank])
        self.updates.drop(rank)
        self.chan.forget(rank)
        name = self._name(rank)
        for kind in (GENERATION, WEIGHT_UPDATE):
            self.watchdog.cancel(kind, name)
        self.gen_clocks.pop(rank, None)
        offered_only = self.joiners.pop(rank, None) is not None and rank not in self.sched.joining
        commands = [] if offered_only else self.sched.lose_generator(rank)
        alive, least = len(self.sched.alive), self.cfg.rollout.min_generators
        self.progress.note(f"lost {name} at version {self.version}: {alive} of {len(self.generators)} generators left"
                           + (f", fewer than rollout.min_generators = {least}: checkpoint and stop" if alive < least
                              else ""))
        self._execute(commands)

    def _explain_broken_update(self, version: int, what: str) -> None:
        """A weight transfer broke: a generator lost since this round of the update began must
        explain it (the update is then done again without it), within BROKEN_UPDATE_GRACE_S."""
        self.unexplained.append((self.now + BROKEN_UPDATE_GRACE_S, self.sync_started[version], what))

    def _check_unexplained(self) -> None:
        """A broken update that no lost generator explains in time is a real transport failure."""
        self.unexplained = [u for u in self.unexplained if not self._lost_since(u[1])]
        late = [what for deadline, _, what in self.unexplained if self.now > deadline]
        if late:
            abort_job(self.chan.comm, f"weight update failed with every generator alive: {late[0]}")

    def _lost_since(self, since: float) -> bool:
        """Whether a generator was lost at or after `since` (a monotonic time)."""
        return any(at >= since for at in self.loss_times)

    def _relay(self, address: WeightGroupAddress) -> None:
        """A stage leader's new weight group, to the generators that are to join it."""
        for g in address.generators:
            self.chan.send(g, address)

    def _died(self, rank: int) -> str:
        role, index = role_of(self.cfg, rank)
        return (f"rank {rank} ({role} {index}) died without reporting an error"
                " (its process ended: killed by a signal, the out-of-memory killer or a lost node)")

    def _on_worker_failed(self, failed: WorkerFailed) -> None:
        """A worker's error is often the echo of a peer's death (its collective lost the peer):
        a rank whose lifeline ends within DEAD_PEER_GRACE_S is named first, as the cause. A
        generator's error once every worker was ready, with no other rank but generators dead, is
        survived as its death is: its lifeline is cut, which ends its process."""
        deadline = time.monotonic() + DEAD_PEER_GRACE_S
        dead = self._dead()
        while not dead and time.monotonic() < deadline:
            time.sleep(POLL_S)
            dead = self._dead()
        alive = {*self.sched.alive, *self.joiners}
        if self.ready and failed.rank in alive and all(rank in alive for rank in dead):
            for rank in dead:
                self._lose(rank, self._died(rank))
            if failed.rank not in self.lost_at:
                # Its process leaves now, not after its clean-up: until then its weight-group
                # sockets are open and a transfer to its group waits on it.
                self.lifelines.cut(failed.rank)
                self.leaving[failed.rank] = self.now
                self._lose(failed.rank, describe(failed))
            return
        causes = [self._died(rank) for rank in dead]
        abort_job(self.chan.comm, "; ".join([*causes, ("then " if causes else "") + describe(failed)]))

    # ---- replacements ---------------------------------------------------------------------

    def _check_replacements(self) -> None:
        """Offer each vacant generator rank (lost, its process gone) to a replacement that joined
        (runtime/replacements.py); drop one that is not ready within startup_timeout_s."""
        vacant = [] if self.sched.stop_requested else [
            r for r in self.lost_at if r not in self.leaving and r not in self.lifelines.held]
        for rank, link in self.replacements.match(vacant):
            self.chan.attach(rank, link)
            self.chan.send(rank, JoinOffer(rank))
            del self.lost_at[rank]
            self.joiners[rank] = self.now
            self.progress.note(f"a replacement takes the place of {self._name(rank)} ({self.replacements.offered} of"
                               f" rollout.max_replacements = {self.replacements.budget})")
        timeout = self.cfg.startup_timeout_s
        for rank in [r for r, at in self.joiners.items() if r not in self.sched.joining and self.now - at > timeout]:
            if rank in self.lifelines.held:
                self.lifelines.cut(rank)
                self.leaving[rank] = self.now
            self._lose(rank, f"{self._name(rank)} (a replacement) was not ready within startup_timeout_s ="
                             f" {timeout:g} s")

    def _joined(self, rank: int, version: int) -> None:
        del self.joiners[rank]
        self.samples[rank] = 0
        self.replaced.add(rank)
        self.gen_clocks[rank] = BusyClock(self.now)
        self.progress.note(f"{self._name(rank)} (a replacement) serves version {version}: {len(self.sched.alive)} of"
                           f" {len(self.generators)} generators")

    # ---- messages in, commands out ----------------------------------------------------------

    def _handle(self, src: int, msg: object) -> None:
        if src in self.lost_at:
            # Sent before it was lost, read after: its prompts are already generated again elsewhere.
            return
        if isinstance(msg, Trajectory):
            self.samples[src] = self.samples.get(src, 0) + 1
            if src in self.replaced and self.samples[src] == 1:
                self.progress.note(f"{self._name(src)} (a replacement) sent its first trajectory")
            if msg.prompt_id >= 0:
                self.step_gen_tokens += len(msg.output_ids)
                self.counters["generated_tokens"] += len(msg.output_ids)
            self._execute(self.sched.on_trajectory(msg))
            self._watch_generation(src)
        elif isinstance(msg, StepDone):
            self.watchdog.finish(TRAIN_STEP, TRAINER, self.now)
            commands = self.sched.on_step_done(msg.version)
            self._record_step(msg)
            self._execute(commands)
        elif isinstance(msg, WeightsSent):
            if msg.error is not None:
                self._explain_broken_update(msg.version, f"{self._name(src)} could not send version {msg.version}"
                                            f" of stage {msg.stage}: {msg.error}")
            self._execute(self.sched.on_weights_sent(msg.stage, msg.version, msg.checksums, msg.error))
        elif isinstance(msg, UpdateBegun):
            self.updates.begun(msg.generator_rank, msg.version)
            if self.updates.paused(msg.generator_rank):  # watched as an update from now on
                self.watchdog.cancel(GENERATION, self._name(msg.generator_rank))
        elif isinstance(msg, WeightsLoaded) and msg.error is not None:
            self._explain_broken_update(msg.version, f"{self._name(src)} could not load version {msg.version}:"
                                        f" {msg.error}")
            self._update_ended(msg.generator_rank, msg.version)
            self._execute(self.sched.on_weights_loaded(msg.generator_rank, msg.version, {}, msg.error))
        elif isinstance(msg, WeightsLoaded):
            self.sync_seconds[(msg.generator_rank, msg.version)] = msg.seconds
            for key, value in msg.engine_stats.items():
                self.step_engine_stats[key] = self.step_engine_stats.get(key, 0.0) + value
            self._update_ended(msg.generator_rank, msg.version)
            self._execute(self.sched.on_weights_loaded(msg.generator_rank, msg.version, msg.checksums))
        elif isinstance(msg, CheckpointSaved):
            self._on_checkpoint_saved(msg)
        elif isinstance(msg, WeightGroupAddress):
            self._relay(msg)
        elif isinstance(msg, WorkerFailed):
            self._on_worker_failed(msg)
        elif isinstance(msg, WorkerReady) and src in self.joiners:
            self.sched.join_generator(src)
            self.progress.note(f"{self._name(src)} (a replacement) is ready: the next weight update brings it the"
                               " current version")
        else:
            raise RuntimeError(f"unexpected message from rank {src}: {msg!r:.200}")

    def _name(self, rank: int) -> str:
        role, index = role_of(self.cfg, rank)
        return f"rank {rank} ({role} {index})"

    def _update_ended(self, generator: int, version: int) -> None:
        """`generator` loaded `version` (or its transfer broke). If a later update was queued behind
        it, the generator is in that one now: a new clock for it. Either way it generates until it
        takes up the next update."""
        who = self._name(generator)
        later = self.updates.loaded(generator, version)
        if later is None:
            self.watchdog.finish(WEIGHT_UPDATE, who, self.now)
        else:
            self.watchdog.start(WEIGHT_UPDATE, who, f"version {later}", self.now)
        self._watch_generation(generator)

    def _watch_generation(self, generator: int) -> None:
        """A generator's clock restarts whenever it shows progress, and stops when it has no work;
        once it has taken an update up it is watched as an update, not a generation (its samples
        then are ones finished before the pause). Until then it is still generating, and a main
        loop that hangs there is named by its generation deadline, not by the update's (the
        first update's is `first_s`, which allows for connecting)."""
        who = self._name(generator)
        if self.updates.paused(generator):
            return
        if self.sched.generators.load.get(generator, 0) > 0:
            self.watchdog.progress(GENERATION, who, "its prompts in flight", self.now)
        else:
            self.watchdog.finish(GENERATION, who, self.now)

    def _execute(self, commands: list[Command]) -> None:
        for c in commands:
            if isinstance(c, Submit):
                self._submit(c)
                if not self.updates.paused(c.generator):
                    self.watchdog.start_if_idle(GENERATION, self._name(c.generator), "its prompts in flight",
                                                self.now)
            elif isinstance(c, Train):
                self._dispatch(c)
                self.watchdog.start(TRAIN_STEP, TRAINER, f"for version {c.version}", self.now)
            elif isinstance(c, SyncWeights):
                self._update_weights(c.version, c.generators, c.group)
                for g in c.generators:  # its generation clock runs on until it takes the update up
                    self.updates.sent(g, c.version)
                    self.watchdog.start(WEIGHT_UPDATE, self._name(g), f"version {c.version}", self.now)
            elif isinstance(c, StepFinished):
                with (self.run_dir / LEDGER_FILE).open("a") as f:
                    f.write(json.dumps({"step": c.version - 1, "prompt_ids": [g.prompt_id for g in c.groups]}) + "\n")
            elif isinstance(c, WeightsVerified):
                with (self.run_dir / WEIGHTS_FILE).open("a") as f:
                    record = {"version": c.version, "generator_rank": c.generator,
                              "seconds": self.sync_seconds.pop((c.generator, c.version)), "tensors": c.tensors,
                              "stages": self.cfg.trainer.pp}
                    f.write(json.dumps(record) + "\n")
                if c.generator in self.joiners:
                    self._joined(c.generator, c.version)
            elif isinstance(c, SyncFinished):
                self.last_sync_s = self.now - self.sync_started.pop(c.version)
            elif isinstance(c, Checkpoint):
                if self._checkpoint(c.version, c.hf):
                    self.watchdog.start(CHECKPOINT, TRAINER, str(self.ckpt_path), self.now)
            elif isinstance(c, EvalFinished):
                self._on_eval_finished(c)
            else:
                raise RuntimeError(f"unknown scheduler command {c!r:.200}")

    def _record_step(self, done: StepDone) -> None:
        """The step's metrics: what the batch held (measured at dispatch) and what the trainer said."""
        step, self.step = self.step, None
        interval = self.now - self.last_step_at
        self.last_step_at = self.now
        self.counters["elapsed_s"] += interval
        self.counters["trained_tokens"] += step.stats["trained_tokens"]
        record = dict(step.stats)
        record.update({f"train/{k}": float(v) for k, v in done.metrics.items() if isinstance(v, int | float)})
        record.update(
            {
                "version": float(done.version),
                # Unix time of the record, to line steps up with logs and with other jobs (requeues).
                "wall_time": time.time(),
                "elapsed_s": self.counters["elapsed_s"],
                "step_s": interval,
                "train_s": self.now - step.dispatched_at,
                "effective_tokens_per_s": step.stats["trained_tokens"] / max(interval, 1e-9),
                "trained_tokens_per_s": step.stats["trained_tokens"] / max(self.now - step.dispatched_at, 1e-9),
                "generated_tokens_per_s": self.step_gen_tokens / max(interval, 1e-9),
                "trained_tokens_total": self.counters["trained_tokens"],
                "generated_tokens_total": self.counters["generated_tokens"],
                "buffer_groups": float(self.sched.buffer.ready),
                "running_prompts": float(self.sched.buffer.running),
                "trainer_idle_fraction": self.trainer_clock.idle_fraction(self.now),
                "generator_idle_fraction": sum(c.idle_fraction(self.now) for c in self.gen_clocks.values())
                / max(len(self.gen_clocks), 1),
                "generators_alive": float(len(self.sched.alive)),
            }
        )
        if self.last_sync_s is not None:
            record["weight_sync_s"] = self.last_sync_s
        record.update(self.step_engine_stats)
        self.step_engine_stats = {}
        self.step_gen_tokens = 0.0
        self.metrics.write(done.version, record)
        self.progress.update(done.version, record)

    def _update_weights(self, version: int, generators: tuple[int, ...], group: int) -> None:
        msg = UpdateWeights(version, generators, group)
        self.trainers.command(msg)
        for g in generators:
            self.chan.send(g, msg)
        self.sync_started[version] = self.now

    def _submit(self, c: Submit) -> None:
        r = self.cfg.rollout
        sampling = SamplingParams(r.max_new_tokens, r.temperature, r.top_p, r.top_k, c.seed)
        p = self.prompts
        if c.prompt_id >= 0:
            req = GenerateRequest(c.prompt_id, p.train_ids[c.row], r.group_size, sampling,
                                  p.train_references[c.row], p.train[c.row].data_source)
        else:
            e = self.cfg.eval
            sampling = SamplingParams(e.max_new_tokens or r.max_new_tokens,
                                      r.temperature if e.temperature is None else e.temperature,
                                      r.top_p if e.top_p is None else e.top_p, r.top_k, c.seed)
            req = GenerateRequest(c.prompt_id, p.held_out_ids[c.row], e.n or r.group_size, sampling,
                                  p.held_out_references[c.row], p.held_out[c.row].data_source)
        self.chan.send(c.generator, req)

    def _dispatch(self, c: Train) -> None:
        trajectories, failed = trainable(c.groups)
        least = self.cfg.ppo.minibatches * self.cfg.trainer.dp
        if len(trajectories) < least:
            reasons = sorted({t.reward_reason for t in failed})
            abort_job(self.chan.comm, f"the reward service failed on {len(failed)} of the"
                      f" {len(trajectories) + len(failed)} samples of the batch for version {c.version}, leaving"
                      f" fewer than the {least} (ppo.minibatches x trainer.dp) a step needs: "
                      + "; ".join(reasons[:3]))
        stats = batch_stats(trajectories, c.version)
        stats["reward_infra_failures"] = float(len(failed))
        if failed:
            log.warning("version %d: %d sample(s) left out of training, the reward service failed on them: %s",
                        c.version, len(failed), failed[0].reward_reason)
        self.step = StepTiming(stats, self.now)
        self.trainers.batch(c.version, trajectories)

    def _update_clocks(self) -> None:
        self.trainer_clock.set(self.sched.trainer_busy, self.now)
        for g, clock in self.gen_clocks.items():
            clock.set(self.sched.generator_busy(g), self.now)

    # ---- evaluation -----------------------------------------------------------------------

    def _on_eval_finished(self, ev: EvalFinished) -> None:
        acc = accuracy(ev.results)
        n = len(ev.results)
        record = {
            "eval_accuracy": acc,
            "eval_reward_mean": sum(t.reward for t in ev.results) / n,
            "eval_response_len_mean": sum(len(t.output_ids) for t in ev.results) / n,
            **self._eval_pass_at_k(ev.results),
            **self._eval_sets(ev),
            **source_stats(ev.results, prefix="eval_source/"),
        }
        self.metrics.write(ev.version, record)
        self._write_eval_samples(ev)
        widest = max((k for k in record if k.startswith("eval_pass@")), key=lambda k: int(k.split("@")[1]))
        self.progress.note(
            f"held-out accuracy at version {ev.version}: {acc:.3f}, {widest.removeprefix('eval_')}"
            f" {record[widest]:.3f} ({len(self.prompts.held_out)} prompts x {self.cfg.eval.n or self.cfg.rollout.group_size}"
            " samples)"
        )

    def _eval_pass_at_k(self, results: list, prefix: str = "eval_") -> dict[str, float]:
        """pass@k for k = 1, 2, 4, ... n (the unbiased estimator of `areal-hpc eval`): how far
        sampling k answers beats one, the headroom RL turns into pass@1."""
        correct: dict[int, list[bool]] = {}
        for t in results:
            correct.setdefault(t.prompt_id, []).append(t.correct)
        n = min(len(c) for c in correct.values())
        return {f"{prefix}pass@{k}": sum(pass_at_k(len(c), sum(c), k) for c in correct.values()) / len(correct)
                for k in ks_for(n)}

    def _eval_sets(self, ev: EvalFinished) -> dict[str, float]:
        """With several held-out sets (eval.paths), each one's accuracy and pass@k."""
        sets = self.prompts.held_out_sets
        if len(sets) < 2:
            return {}
        out: dict[str, float] = {}
        start = 0
        for name, size in sets:
            rows = range(start, start + size)
            results = [t for t in ev.results if -1 - t.prompt_id in rows]
            start += size
            if results:
                out[f"eval_set/{name}/accuracy"] = accuracy(results)
                out.update(self._eval_pass_at_k(results, f"eval_set/{name}/"))
        return out

    def _write_eval_samples(self, ev: EvalFinished) -> None:
        """Per held-out prompt: its rewards and response lengths, for analysis after the run."""
        rows: dict[int, dict] = {}
        for t in sorted(ev.results, key=lambda t: (t.prompt_id, t.sample_index)):
            row = -1 - t.prompt_id
            entry = rows.setdefault(row, {"row": row, "prompt": self.prompts.held_out[row].prompt,
                                          "answer": self.prompts.held_out[row].answer, "rewards": [], "correct": [],
                                          "lengths": []})
            entry["rewards"].append(t.reward)
            entry["correct"].append(t.correct)
            entry["lengths"].append(len(t.output_ids))
        path = self.run_dir / "eval" / f"version-{ev.version:06d}.jsonl"
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows.values()))

    # ---- checkpoints ----------------------------------------------------------------------

    def _checkpoint(self, version: int, hf: bool) -> bool:
        """Trainer part (with `hf`, also its Hugging Face export), controller state, the config and
        the tokenizer of `version`; complete once all exist. The config and the tokenizer make the
        checkpoint exportable on its own (`areal-hpc export-hf`). One of an interval that its file
        system has no room for (by the last one's size) is not begun, so that a full disk costs
        the run its checkpoints, not a crash and requeue at every interval; the run's last one, or
        a stop's, is always tried. False if not begun."""
        root = ckpt.root_dir(self.cfg)
        final = version >= self.cfg.total_steps or self.sched.stop_requested
        if not final and (why := ckpt.no_room(root, last := ckpt.latest_complete(root))):
            log.warning("checkpoint of version %d not written: %s; the run goes on, a restart resumes from %s and the"
                        " next interval tries again (free space, or lower checkpoint.keep_last)", version, why, last)
            self.ckpts_skipped.append(version)
            self.sched.on_checkpoint_skipped()
            return False
        path = ckpt.step_dir(root, version)
        shutil.rmtree(path, ignore_errors=True)  # a leftover of an earlier run must not count
        path.mkdir(parents=True)
        self.trainers.command(SaveCheckpoint(str(path), version, hf))
        state = self.sched.state_dict()
        ckpt.ControllerState(version=version, counters=dict(self.counters), **state).save(path)
        save_config(self.cfg, ckpt.config_file(path))
        write_tokenizer(ckpt.tokenizer_dir(path), Path(self.cfg.model.tokenizer_path or self.model_dir), self.model_dir)
        self.ckpt_path = path
        return True

    def _on_checkpoint_saved(self, saved: CheckpointSaved) -> None:
        path = Path(saved.path)
        if path != self.ckpt_path:
            raise RuntimeError(f"CheckpointSaved for {path}, expected {self.ckpt_path}")
        self.sched.on_checkpoint_saved()
        self.watchdog.finish(CHECKPOINT, TRAINER, self.now)
        ckpt.mark_complete(path)
        ckpt.prune(path.parent, self.cfg.checkpoint.keep_last)
        self.ckpt_path = None
        self.progress.note(f"checkpoint {path} complete")

    def _truncate_logs(self) -> None:
        """Steps the resumed checkpoint does not contain never happened (a fresh run starts empty)."""
        for name, key, newest in ((LEDGER_FILE, "step", self.version - 1), (WEIGHTS_FILE, "version", self.version)):
            path = self.run_dir / name
            records = read_records(path) if self.resumed else []
            rewrite_records(path, (r for r in records if r[key] <= newest))

    # ---- the end --------------------------------------------------------------------------

    def _shutdown(self, reason: str, code: int) -> int:
        # With a rank gone, MPI_Finalize would wait for it: every rank is told to exit without.
        self.chan.finalize = not self.sched.lost
        msg = Shutdown(reason, finalize=self.chan.finalize)
        self.trainers.command(msg)
        for g in {*self.sched.alive, *self.joiners}:
            self.chan.send(g, msg)
        self.replacements.close(f"the run ended ({reason})")
        self.chan.flush()
        if self.ckpts_skipped:
            self.progress.note(f"checkpoints not written for lack of room: versions {self.ckpts_skipped}; the newest"
                               f" complete one is {ckpt.latest_complete(ckpt.root_dir(self.cfg))}")
        if self.replaced:
            self.progress.note("samples per generator: " + ", ".join(
                f"rank {g}{' (replacement)' if g in self.replaced else ''}: {n}" for g, n in sorted(self.samples.items())))
        self.progress.close()
        self.metrics.close()
        records = read_records(self.run_dir / "metrics.jsonl")
        summary, png = report.finish(self.run_dir, records, f"{self.cfg.name}: eta={self.cfg.rollout.eta}")
        print(f"metrics: {self.run_dir / 'metrics.jsonl'}\nplot: {png}", flush=True)
        return code
