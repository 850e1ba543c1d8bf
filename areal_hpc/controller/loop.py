"""Rank 0's event loop: admission under the staleness bound, dispatch, versions, checkpoints.

The loop never blocks on one worker: each turn it drains every message that has arrived, then
admits generation requests while the staleness manager has capacity, then hands the oldest
complete groups to the trainer when a batch may train. After each step it tells the trainers and
the generators to move the new weights (bulk tensors go through the weight groups, not MPI), and
records the step's metrics once every generator serves the new version.

Held-out prompts are evaluated through the same generators under negative prompt ids
(-1 - row), so they never enter the staleness count or the buffer.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.controller import checkpoint as ckpt
from areal_hpc.controller.buffer import Group, TrajectoryBuffer
from areal_hpc.controller.staleness import StalenessManager
from areal_hpc.data.stream import PromptStream
from areal_hpc.metrics import report
from areal_hpc.metrics.batch import accuracy, batch_stats
from areal_hpc.metrics.clock import BusyClock
from areal_hpc.metrics.progress import Progress
from areal_hpc.metrics.writer import MetricsWriter, read_metrics
from areal_hpc.runtime.failure import abort_job, describe
from areal_hpc.runtime.layout import generator_ranks, role_of, trainer_ranks
from areal_hpc.runtime.lifeline import LifelineServer
from areal_hpc.runtime.messages import (
    CheckpointSaved,
    GenerateRequest,
    LaunchPlan,
    SamplingParams,
    SaveCheckpoint,
    Shutdown,
    StepDone,
    TrainBatch,
    Trajectory,
    UpdateWeights,
    WeightGroupAddress,
    WeightsLoaded,
    WeightsSent,
    WorkerFailed,
    WorkerReady,
)
from areal_hpc.runtime.preflight import Prompts
from areal_hpc.runtime.transport import POLL_S, Channel

log = logging.getLogger(__name__)
LEDGER_FILE = "ledger.jsonl"
WEIGHTS_FILE = "weights.jsonl"
# Seconds rank 0 watches the lifelines after a worker reports an error, for a dead peer behind it.
DEAD_PEER_GRACE_S = 1.0


def least_loaded(load: dict[int, int]) -> int:
    """The generator with the fewest prompts in flight (lowest rank on ties)."""
    return min(load, key=lambda r: (load[r], r))


def eval_id(row: int) -> int:
    return -1 - row


@dataclass
class EvalRound:
    version: int
    # Samples still to come, per held-out prompt id.
    left: dict[int, int]
    results: list[Trajectory] = field(default_factory=list)


@dataclass
class InFlightStep:
    version: int
    groups: list[Group]
    stats: dict[str, float]
    dispatched_at: float


class Controller:
    def __init__(self, plan: LaunchPlan, prompts: Prompts, chan: Channel, lifelines: LifelineServer) -> None:
        cfg: ExperimentConfig = plan.config
        self.cfg, self.prompts, self.chan, self.lifelines = cfg, prompts, chan, lifelines
        self.run_dir = Path(cfg.logging.dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        r = cfg.rollout
        self.trainer_leader = trainer_ranks(cfg)[0]
        self.generators = generator_ranks(cfg)
        self.rng = random.Random(cfg.seed)
        self.stream = PromptStream(len(prompts.train), cfg.seed, cfg.data.shuffle)
        self.counters: dict[str, float] = {"elapsed_s": 0.0, "trained_tokens": 0.0, "generated_tokens": 0.0}
        if plan.resume_dir is None:
            self.sm = StalenessManager(r.eta, r.batch_prompts, r.max_concurrent, r.staleness_gate)
            self.buffer = TrajectoryBuffer()
        else:
            state = ckpt.ControllerState.load(plan.resume_dir)
            self.sm = StalenessManager.from_state(state.staleness, r.eta, r.batch_prompts, r.max_concurrent,
                                                  r.staleness_gate)
            self.buffer = TrajectoryBuffer.from_state(state.buffer)
            self.stream.load_state_dict(state.stream)
            ckpt.set_rng_state(self.rng, state.rng)
            self.counters.update(state.counters)
        self.resumed = plan.resume_dir is not None
        if not self.resumed:
            for old in ckpt.discard_all(ckpt.root_dir(cfg)):
                log.warning("starting afresh: removed checkpoint %s of an earlier run", old)
        self.version = self.sm.version
        self.total = cfg.total_steps
        self._truncate_logs()
        self.metrics = MetricsWriter(self.run_dir, cfg.logging.tensorboard, resume_step=self.version)
        self.progress = Progress(self.total, self.version, cfg.logging.progress)
        # Generation bookkeeping: prompts in flight per generator, the generator of each prompt.
        self.load = {g: 0 for g in self.generators}
        self.where: dict[int, int] = {}
        self.served = dict.fromkeys(self.generators, 0)  # engines start from the model directory
        self.syncing: dict[int, tuple[float, set[int]]] = {}  # version -> (start, generators left)
        # Checksums of the tensors the trainer stages sent, and what the generators reported.
        self.sent: dict[int, dict[int, dict[str, str]]] = {}  # version -> stage -> checksums
        self.loaded: dict[int, list[WeightsLoaded]] = {}
        self.step: InFlightStep | None = None
        # Seconds of the latest completed weight update (trainer send to the last generator loaded).
        self.last_sync_s: float | None = None
        self.eval: EvalRound | None = None
        self.ckpt_in_progress: Path | None = None
        self.ckpt_requested = False
        self.stop_requested = False
        # Training prompts are admitted only after the start-up eval or weight sync.
        self.training = False
        self.last_ckpt_version = self.version if self.resumed else -1
        self.step_gen_tokens = 0.0
        self.now = time.monotonic()
        self.last_step_at = self.now
        self.trainer_clock = BusyClock(self.now)
        self.trainer_tasks: set[str] = set()
        self.gen_clocks = {g: BusyClock(self.now) for g in self.generators}

    # ---- the loop -------------------------------------------------------------------------

    def run(self) -> int:
        signal.signal(signal.SIGUSR1, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        self._wait_ready()
        self.now = time.monotonic()
        if self.resumed:
            self.progress.note(f"resumed from version {self.version} ({self.sm.accepted} prompts accepted)")
            self._update_weights()
            self._until(lambda: not self.syncing)
        else:
            self._start_eval(self.version)
            self._until(lambda: self.eval is None)
        self.last_step_at = self.now
        self.training = True
        for clock in (self.trainer_clock, *self.gen_clocks.values()):
            clock.idle_fraction(self.now)
        self._until(self._finished)
        if self.stop_requested:
            self.progress.note(f"stopped on request at version {self.version}; checkpoint saved")
            return self._shutdown("stopped on signal", 0)
        self._until(lambda: self.eval is None)  # one started during training
        self._start_eval(self.version)
        self._until(lambda: self.eval is None)
        return self._shutdown("done", 0)

    def _finished(self) -> bool:
        if self.ckpt_requested or self.ckpt_in_progress is not None:
            return False
        # A weight update in flight completes first: a stop never leaves a generator mid-update.
        return (self.stop_requested or self.version >= self.total) and not self.syncing

    def _until(self, done) -> None:
        """Run turns of the loop until `done()`."""
        while not done():
            worked = self._turn()
            if not worked:
                time.sleep(POLL_S)

    def _turn(self) -> bool:
        self.now = time.monotonic()
        self._check_lifelines()
        worked = False
        while (got := self.chan.poll()) is not None:
            self._handle(*got)
            worked = True
        self.now = time.monotonic()
        if self.ckpt_requested and self.step is None and self.ckpt_in_progress is None:
            self.ckpt_requested = False
            # Version 0 is the initial model: resuming there is starting afresh.
            if self.version > 0 and self.last_ckpt_version != self.version:
                self._checkpoint()
        if self.training and not self.stop_requested:
            worked |= self._admit()
            worked |= self._dispatch()
        self._update_clocks()
        return worked

    def _on_signal(self, signum: int, _frame) -> None:
        """SIGUSR1: checkpoint at the next step boundary and go on; SIGTERM: checkpoint and stop."""
        self.ckpt_requested = True
        if signum == signal.SIGTERM:
            self.stop_requested = True

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
                for g in self.generators:
                    self.chan.send(g, msg)
            elif isinstance(msg, WorkerReady):
                waiting.discard(msg.rank)
            else:
                self._handle(src, msg)
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
        node): name it and end the job."""
        dead = self.lifelines.ended()
        if dead:
            abort_job(self.chan.comm, "; ".join(self._died(rank) for rank in dead))

    def _died(self, rank: int) -> str:
        role, index = role_of(self.cfg, rank)
        return (f"rank {rank} ({role} {index}) died without reporting an error"
                " (its process ended: killed by a signal, the out-of-memory killer or a lost node)")

    def _on_worker_failed(self, failed: WorkerFailed) -> None:
        """A worker's error is often the echo of a peer's death (its collective lost the peer):
        a rank whose lifeline ends within DEAD_PEER_GRACE_S is named first, as the cause."""
        deadline = time.monotonic() + DEAD_PEER_GRACE_S
        dead = self.lifelines.ended()
        while not dead and time.monotonic() < deadline:
            time.sleep(POLL_S)
            dead = self.lifelines.ended()
        causes = [self._died(rank) for rank in dead]
        abort_job(self.chan.comm, "; ".join([*causes, ("then " if causes else "") + describe(failed)]))

    # ---- messages -------------------------------------------------------------------------

    def _handle(self, src: int, msg: object) -> None:
        if isinstance(msg, Trajectory):
            self._on_trajectory(msg)
        elif isinstance(msg, StepDone):
            self._on_step_done(msg)
        elif isinstance(msg, WeightsSent):
            self.sent.setdefault(msg.version, {})[msg.stage] = msg.checksums
            self._check_loaded()
        elif isinstance(msg, WeightsLoaded):
            self.loaded.setdefault(msg.version, []).append(msg)
            self._check_loaded()
        elif isinstance(msg, CheckpointSaved):
            self._on_checkpoint_saved(msg)
        elif isinstance(msg, WorkerFailed):
            self._on_worker_failed(msg)
        else:
            raise RuntimeError(f"unexpected message from rank {src}: {msg!r:.200}")

    def _on_trajectory(self, traj: Trajectory) -> None:
        if traj.prompt_id < 0:
            self._on_eval_result(traj)
            return
        self.step_gen_tokens += len(traj.output_ids)
        self.counters["generated_tokens"] += len(traj.output_ids)
        if self.buffer.add(traj) is not None:
            self.sm.accept()
            self.load[self.where.pop(traj.prompt_id)] -= 1

    def _on_step_done(self, done: StepDone) -> None:
        step = self.step
        if step is None or done.version != step.version + 1:
            raise RuntimeError(f"StepDone for version {done.version} but no such step was running")
        self.step = None
        self.trainer_tasks.discard("train")
        self.version = done.version
        self.sm.set_version(done.version)
        interval = self.now - self.last_step_at
        self.last_step_at = self.now
        self.counters["elapsed_s"] += interval
        self.counters["trained_tokens"] += step.stats["trained_tokens"]
        record = dict(step.stats)
        record.update({f"train/{k}": float(v) for k, v in done.metrics.items() if isinstance(v, int | float)})
        record.update(
            {
                "version": float(done.version),
                "elapsed_s": self.counters["elapsed_s"],
                "step_s": interval,
                "train_s": self.now - step.dispatched_at,
                "effective_tokens_per_s": step.stats["trained_tokens"] / max(interval, 1e-9),
                "trained_tokens_per_s": step.stats["trained_tokens"] / max(self.now - step.dispatched_at, 1e-9),
                "generated_tokens_per_s": self.step_gen_tokens / max(interval, 1e-9),
                "trained_tokens_total": self.counters["trained_tokens"],
                "generated_tokens_total": self.counters["generated_tokens"],
                "buffer_groups": float(self.buffer.ready),
                "running_prompts": float(self.buffer.running),
                "trainer_idle_fraction": self.trainer_clock.idle_fraction(self.now),
                "generator_idle_fraction": sum(c.idle_fraction(self.now) for c in self.gen_clocks.values())
                / len(self.gen_clocks),
            }
        )
        if self.last_sync_s is not None:
            record["weight_sync_s"] = self.last_sync_s
        self.step_gen_tokens = 0.0
        self.metrics.write(done.version, record)
        self.progress.update(done.version, record)
        with (self.run_dir / LEDGER_FILE).open("a") as f:
            f.write(json.dumps({"step": step.version, "prompt_ids": [g.prompt_id for g in step.groups]}) + "\n")
        self._update_weights()
        interval_steps = self.cfg.checkpoint.interval_steps
        if interval_steps and done.version % interval_steps == 0:
            self.ckpt_requested = True

    def _update_weights(self) -> None:
        msg = UpdateWeights(self.version)
        self.chan.send(self.trainer_leader, msg)
        for g in self.generators:
            self.chan.send(g, msg)
        self.syncing[self.version] = (self.now, set(self.generators))
        self.trainer_tasks.add("sync")

    def _check_loaded(self) -> None:
        """Once every stage has sent a version, compare each generator's checksums with them."""
        for version in sorted(self.loaded):
            stages = self.sent.get(version, {})
            if len(stages) < self.cfg.trainer.pp:
                continue
            sent = {name: digest for sums in stages.values() for name, digest in sums.items()}
            for loaded in self.loaded.pop(version):
                bad = sorted(k for k in sent.keys() | loaded.checksums.keys() if sent.get(k) != loaded.checksums.get(k))
                if bad:
                    raise RuntimeError(
                        f"generator rank {loaded.generator_rank} loaded version {version} with {len(bad)}"
                        f" tensor(s) differing from what the trainer sent: {', '.join(bad[:5])}"
                    )
                with (self.run_dir / WEIGHTS_FILE).open("a") as f:
                    record = {"version": version, "generator_rank": loaded.generator_rank,
                              "seconds": loaded.seconds, "tensors": len(sent), "stages": len(stages)}
                    f.write(json.dumps(record) + "\n")
                self._on_weights_loaded(loaded)
            if version not in self.syncing:
                del self.sent[version]

    def _on_weights_loaded(self, loaded: WeightsLoaded) -> None:
        start, left = self.syncing[loaded.version]
        left.discard(loaded.generator_rank)
        self.served[loaded.generator_rank] = loaded.version
        if left:
            return
        del self.syncing[loaded.version]
        if not self.syncing:
            self.trainer_tasks.discard("sync")
        self.last_sync_s = self.now - start
        every = self.cfg.eval_interval
        if every and loaded.version % every == 0 and loaded.version < self.total and self.eval is None:
            self._start_eval(loaded.version)

    # ---- generation -----------------------------------------------------------------------

    def _sampling(self) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(r.max_new_tokens, r.temperature, r.top_p, r.top_k, self.rng.randrange(2**31))

    def _reward_spec(self, answer: str) -> dict:
        return {"kind": self.cfg.reward.kind, "answer": answer}

    def _admit(self) -> bool:
        """Submit prompts while the staleness bound allows and later steps still need them."""
        needed = self.total * self.sm.batch_prompts
        admitted = False
        while self.sm.capacity() > 0 and self.sm.accepted + self.sm.running < needed:
            pid = self.stream.next()
            row = self.stream.index(pid)
            gen = least_loaded(self.load)
            req = GenerateRequest(
                pid,
                self.prompts.train_ids[row],
                self.cfg.rollout.group_size,
                self._sampling(),
                self._reward_spec(self.prompts.train[row].answer),
            )
            self.chan.send(gen, req)
            self.buffer.open(pid, self.version, req.group_size)
            self.sm.submit()
            self.load[gen] += 1
            self.where[pid] = gen
            admitted = True
        return admitted

    def _dispatch(self) -> bool:
        """Send the oldest complete groups to the trainer when a batch may train."""
        b = self.sm.batch_prompts
        if self.step is not None or self.version >= self.total or self.ckpt_requested:
            return False
        if self.buffer.ready < b or not self.sm.may_train(self.buffer.versions_after(b)):
            return False
        groups = self.buffer.pop_batch(b)
        trajectories = [t for g in groups for t in g.trajectories]
        stats = batch_stats(trajectories, self.version, self.cfg.reward.correct)
        self.step = InFlightStep(self.version, groups, stats, self.now)
        self.chan.send(self.trainer_leader, TrainBatch(self.version, trajectories))
        self.trainer_tasks.add("train")
        return True

    def _update_clocks(self) -> None:
        self.trainer_clock.set(bool(self.trainer_tasks), self.now)
        for g, clock in self.gen_clocks.items():
            clock.set(self.load[g] > 0 and self.served[g] == self.version, self.now)

    # ---- evaluation -----------------------------------------------------------------------

    def _start_eval(self, version: int) -> None:
        """Sample every held-out prompt `group_size` times at the rollout temperature (avg@k, as
        the paper reports) with the weights of `version`, which the generators serve now (during
        training, later updates may reach samples still running). The seeds repeat each round,
        so rounds differ only by the weights."""
        k = self.cfg.rollout.group_size
        self.eval = EvalRound(version, {})
        seeds = random.Random(f"eval/{self.cfg.seed}")
        for row, ids in enumerate(self.prompts.held_out_ids):
            gen = least_loaded(self.load)
            sampling = self._sampling()
            sampling.seed = seeds.randrange(2**31)
            req = GenerateRequest(eval_id(row), ids, k, sampling, self._reward_spec(self.prompts.held_out[row].answer))
            self.chan.send(gen, req)
            self.eval.left[req.prompt_id] = k
            self.where[req.prompt_id] = gen
            self.load[gen] += 1

    def _on_eval_result(self, traj: Trajectory) -> None:
        ev = self.eval
        if ev is None or ev.left.get(traj.prompt_id, 0) < 1:
            raise RuntimeError(f"unexpected held-out result for prompt {traj.prompt_id}")
        ev.left[traj.prompt_id] -= 1
        ev.results.append(traj)
        if ev.left[traj.prompt_id] == 0:
            del ev.left[traj.prompt_id]
            self.load[self.where.pop(traj.prompt_id)] -= 1
        if ev.left:
            return
        self.eval = None
        acc = accuracy(ev.results, self.cfg.reward.correct)
        n = len(ev.results)
        record = {
            "eval_accuracy": acc,
            "eval_reward_mean": sum(t.reward for t in ev.results) / n,
            "eval_response_len_mean": sum(len(t.output_ids) for t in ev.results) / n,
        }
        self.metrics.write(ev.version, record)
        self._write_eval_samples(ev)
        self.progress.note(
            f"held-out accuracy at version {ev.version}: {acc:.3f}"
            f" ({len(self.prompts.held_out)} prompts x {self.cfg.rollout.group_size} samples)"
        )

    def _write_eval_samples(self, ev: EvalRound) -> None:
        """Per held-out prompt: its rewards and response lengths, for analysis after the run."""
        rows: dict[int, dict] = {}
        for t in sorted(ev.results, key=lambda t: (t.prompt_id, t.sample_index)):
            row = -1 - t.prompt_id
            entry = rows.setdefault(row, {"row": row, "prompt": self.prompts.held_out[row].prompt,
                                          "answer": self.prompts.held_out[row].answer, "rewards": [], "lengths": []})
            entry["rewards"].append(t.reward)
            entry["lengths"].append(len(t.output_ids))
        path = self.run_dir / "eval" / f"version-{ev.version:06d}.jsonl"
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows.values()))

    # ---- checkpoints ----------------------------------------------------------------------

    def _checkpoint(self) -> None:
        """Trainer part and controller state of the current version; complete once both exist."""
        path = ckpt.step_dir(ckpt.root_dir(self.cfg), self.version)
        shutil.rmtree(path, ignore_errors=True)  # a leftover of an earlier run must not count
        path.mkdir(parents=True)
        self.chan.send(self.trainer_leader, SaveCheckpoint(str(path), self.version))
        stream = self.stream.state_dict(reissue=self.buffer.running_ids())
        ckpt.ControllerState(
            version=self.version,
            staleness=self.sm.state_dict(),
            stream=stream,
            buffer=self.buffer.state_dict(),
            rng=ckpt.rng_state(self.rng),
            counters=dict(self.counters),
        ).save(path)
        self.ckpt_in_progress = path
        self.trainer_tasks.add("checkpoint")

    def _on_checkpoint_saved(self, saved: CheckpointSaved) -> None:
        path = Path(saved.path)
        if path != self.ckpt_in_progress:
            raise RuntimeError(f"CheckpointSaved for {path}, expected {self.ckpt_in_progress}")
        ckpt.mark_complete(path)
        ckpt.prune(path.parent, self.cfg.checkpoint.keep_last)
        self.ckpt_in_progress = None
        self.last_ckpt_version = self.version
        self.trainer_tasks.discard("checkpoint")
        self.progress.note(f"checkpoint {path} complete")

    def _truncate_logs(self) -> None:
        """Steps the resumed checkpoint does not contain never happened (a fresh run starts empty)."""
        for name, key, newest in ((LEDGER_FILE, "step", self.version - 1), (WEIGHTS_FILE, "version", self.version)):
            path = self.run_dir / name
            lines = path.read_text().splitlines() if self.resumed and path.is_file() else []
            path.write_text("".join(line + "\n" for line in lines if json.loads(line)[key] <= newest))

    # ---- the end --------------------------------------------------------------------------

    def _shutdown(self, reason: str, code: int) -> int:
        for rank in range(1, self.chan.size):
            if rank == self.trainer_leader or rank in self.generators:
                self.chan.send(rank, Shutdown(reason))
        self.chan.flush()
        self.progress.close()
        self.metrics.close()
        records = read_metrics(self.run_dir / "metrics.jsonl")
        summary, png = report.finish(self.run_dir, records, f"{self.cfg.name}: eta={self.cfg.rollout.eta}")
        print(f"metrics: {self.run_dir / 'metrics.jsonl'}\nplot: {png}", flush=True)
        return code
