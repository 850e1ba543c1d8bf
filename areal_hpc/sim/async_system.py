"""The fully asynchronous system: generators stream, the trainer steps whenever the buffer holds
a batch of complete prompt groups, and every weight update interrupts the generators (transfer,
then re-prefill of in-flight sequences in abort mode). A finished sample reaches the controller
after its reward latency (Workload.reward_s; the reward pool scores samples in parallel).

Admission and the batch gate are the controller's own Scheduler (areal_hpc.controller.scheduler):
the simulator makes the same decisions as the real system, at any scale.
"""

from __future__ import annotations

import heapq
import itertools
import math

from areal_hpc.controller.scheduler import Policy, Scheduler, Submit, Train
from areal_hpc.sim.cost_model import CostModel
from areal_hpc.sim.engine import Fleet, Group, Trajectory, make_group
from areal_hpc.sim.host import SharedHost
from areal_hpc.sim.layout import Layout
from areal_hpc.sim.lengths import LengthStream
from areal_hpc.sim.run import Run
from areal_hpc.sim.workload import Workload

# The eta and total steps given to the scheduler for an unbounded run (eta = infinity) and for a
# run that stops when the measurement has enough steps.
UNBOUNDED = 1 << 40


def busy_in(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of the intervals that fall inside [start, end]."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)


class _Controller:
    """Rank 0: the controller's own Scheduler decides admissions and batches; this class only
    turns its Submit commands into simulated prompts and reports finished samples back."""

    def __init__(self, w: Workload, fleet: Fleet, lengths: LengthStream):
        self.w, self.fleet, self.lengths = w, fleet, lengths
        eta = UNBOUNDED if w.eta is None else w.eta
        policy = Policy(eta, w.batch_prompts, w.group_size, w.max_concurrent, w.staleness_gate, UNBOUNDED)
        engines = list(range(len(fleet.engines)))
        self.sched = Scheduler(policy, engines, train_size=1, held_out_size=0, shuffle=False)
        self.sched.start_training()
        # The first admission (time 0) starts every prompt at once; until all of them finished,
        # the pipeline is not in its steady state.
        self.burst = -1
        self.burst_left = 0

    @property
    def version(self) -> int:
        return self.sched.version

    def poll(self, now: float) -> list[Group] | None:
        """Admit what the scheduler admits; the batch it hands to the trainer, if any."""
        batch = None
        submits = []
        for c in self.sched.poll():
            if isinstance(c, Submit):
                submits.append(c)
            elif isinstance(c, Train):
                batch = [g.trajectories[0].group for g in c.groups]
        if submits:
            groups = [make_group(c.prompt_id, self.version, self.w.prompt_len, lengths)
                      for c, lengths in zip(submits, self.lengths.take(len(submits)), strict=True)]
            if self.burst < 0:
                self.burst = self.burst_left = len(groups)
            self.fleet.submit(groups, now)
        return batch

    def finished(self, trajs: list[Trajectory]) -> None:
        for traj in trajs:
            group = traj.group
            group.left -= 1
            if group.left == 0:
                self.fleet.release(group)
                if group.ident < self.burst:
                    self.burst_left -= 1
            self.sched.on_trajectory(traj)

    def step_done(self) -> None:
        """The trainer finished a step; in the simulation every engine loads the weights at once
        (the interruption is modelled by the fleet)."""
        version = self.version + 1
        self.sched.on_step_done(version)
        self.sched.on_weights_sent(0, version, {})
        for engine in range(len(self.fleet.engines)):
            self.sched.on_weights_loaded(engine, version, {})


def run_async(layout: Layout, cost: CostModel, w: Workload, fleet: Fleet, measured: int,
              lengths: LengthStream) -> Run:
    """Simulate until at least `measured` steps have run in steady state, over at least the time
    the initial burst of prompts took to drain (the longest generation latency: stragglers make
    the trainer's pace uneven on that scale). Warm-up, not measured: the steps ending before twice
    that drain time (the burst, then its echo, synchronise the pipeline). A step ends when the
    trainer finishes it; its weight update follows."""
    ctl = _Controller(w, fleet, lengths)
    ends: list[float] = []
    tokens: list[int] = []
    trainer_busy: list[tuple[float, float]] = []
    trainer_procs: list[float] = []  # processes busy at once in each of those spans
    train_end = math.inf
    trainer_free = 0.0
    staleness = 0
    gen_busy_start = 0.0
    drained_at: float | None = None
    warmup: int | None = None

    def start_training(batch: list[Group], at: float) -> float:
        nonlocal staleness
        tok = sum(g.tokens for g in batch)
        staleness = max(staleness, ctl.version - min(g.version for g in batch))
        tokens.append(tok)
        seconds = layout.train_s(cost, tok, sum(g.sq_tokens for g in batch), w.minibatches, w.micro_batch_tokens)
        end = at + seconds
        trainer_busy.append((at, end))
        trainer_procs.append(layout.train_procs(cost, tok, seconds, w.minibatches, w.micro_batch_tokens))
        return end

    def receive(now: float, done: list[Trajectory]) -> None:
        """Scored samples reach the controller; a batch they complete starts training."""
        nonlocal drained_at, train_end
        ctl.finished(done)
        if drained_at is None and ctl.burst_left == 0:
            drained_at = now
        batch = ctl.poll(now)
        if batch is not None:
            train_end = start_training(batch, max(now, trainer_free))

    # Finished samples still being scored: (arrival time at the controller, order, samples).
    scoring: list[tuple[float, int, list[Trajectory]]] = []
    order = itertools.count()
    batch = ctl.poll(0.0)
    while warmup is None or len(ends) < warmup + measured or ends[-1] - ends[warmup - 1] < drained_at:
        t_gen = fleet.next_time()
        t_scored = scoring[0][0] if scoring else math.inf
        if train_end <= min(t_gen, t_scored):
            now, train_end = train_end, math.inf
            ends.append(now)
            if warmup is None and drained_at is not None and now >= 2.0 * drained_at:
                warmup = len(ends)
                gen_busy_start = fleet.busy_s(now)
            ctl.step_done()
            update = layout.update_s(cost)
            fleet.interrupt(now, update, w.reprefill)
            trainer_free = now + update
            trainer_busy[-1] = (trainer_busy[-1][0], trainer_free)
            batch = ctl.poll(now)
            if batch is not None:
                train_end = start_training(batch, trainer_free)
        elif t_scored <= t_gen:
            now, _, done = heapq.heappop(scoring)
            receive(now, done)
        elif math.isinf(t_gen):
            raise RuntimeError("simulation stalled: no generation in flight and no batch to train")
        else:
            now, done = fleet.pop()
            if w.reward_s > 0:
                heapq.heappush(scoring, (now + w.reward_s, next(order), done))
            else:
                receive(now, done)
    gen_busy_s = fleet.busy_s(ends[-1]) - gen_busy_start
    train_busy_s = busy_in(trainer_busy, ends[warmup - 1], ends[-1])
    if cost.hw.one_host:
        ends, gen_busy_s, train_busy_s = _on_shared_host(cost.hw.gpus_per_node, layout, fleet, trainer_busy,
                                                         trainer_procs, ends, warmup)
    return Run(
        step_ends=tuple(ends), step_tokens=tuple(tokens), warmup=warmup,
        gen_busy_gpu_s=gen_busy_s * layout.gen_tp,
        train_busy_gpu_s=train_busy_s * layout.train_gpus,
        gen_gpus=layout.gen_gpus, train_gpus=layout.train_gpus, colocated=False,
        max_staleness=staleness, update_s=layout.update_s(cost),
    )


def _on_shared_host(cores: int, layout: Layout, fleet: Fleet, trainer_busy: list[tuple[float, float]],
                    trainer_procs: list[float], ends: list[float], warmup: int) -> tuple[list[float], float, float]:
    """The run on a wall clock that slows while more processes are busy than `cores` (sim/host.py):
    step ends, and engine and trainer busy seconds (per device) within the measured window."""
    spans = [(a, b, layout.gen_tp) for eng in fleet.engines for a, b in eng.spans]
    spans += [(a, b, procs) for (a, b), procs in zip(trainer_busy, trainer_procs, strict=True)]
    host = SharedHost(cores, spans)
    walls = [host.wall(t) for t in ends]
    start, end = walls[warmup - 1], walls[-1]
    gen = sum(busy_in(host.walls(eng.spans), start, end) for eng in fleet.engines)
    return walls, gen, busy_in(host.walls(trainer_busy), start, end)
