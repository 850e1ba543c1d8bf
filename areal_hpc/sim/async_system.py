"""The fully asynchronous system: generators stream, the trainer steps whenever the buffer holds
a batch of complete prompt groups, and every weight update interrupts the generators (transfer,
then re-prefill of in-flight sequences in abort mode).

Admission is the controller's own StalenessManager (areal_hpc.controller), and the batch gate its
may_train rule (the strict gate computed from counts; a test checks they agree), so the simulator
runs the same staleness rule as the real system, at any scale.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter

from areal_hpc.controller.staleness import StalenessManager
from areal_hpc.sim.cost_model import CostModel
from areal_hpc.sim.engine import Fleet, Group, Trajectory, make_group
from areal_hpc.sim.layout import Layout
from areal_hpc.sim.lengths import LengthStream
from areal_hpc.sim.run import Run
from areal_hpc.sim.workload import Workload

# The eta given to the StalenessManager for an unbounded run (eta = infinity).
UNBOUNDED_ETA = 1 << 40


def gate_open(running: Counter[int], ready: Counter[int], batch: int, version: int, eta: int) -> bool:
    """StalenessManager.may_train computed from counts per submission version: train the `batch`
    oldest ready prompts now only if every prompt left untrained (the running ones and the newer
    ready ones) can still be trained within its bound. The oldest prompts have the lowest
    versions, so the batch takes them from the lowest versions up. The controller's list form
    sorts every untrained prompt on each call, too slow at 2,000 prompts in flight."""
    skip, left = batch, 0
    for v in sorted(running.keys() | ready.keys()):
        taken = min(skip, ready[v])
        skip -= taken
        count = running[v] + ready[v] - taken
        left += count
        if count and left > (v + eta - version) * batch:
            return False
    return True


def busy_in(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of the intervals that fall inside [start, end]."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)


class _Controller:
    """Rank 0: the staleness manager, the groups in flight, complete groups oldest first."""

    def __init__(self, w: Workload, fleet: Fleet, lengths: LengthStream):
        self.w, self.fleet, self.lengths = w, fleet, lengths
        eta = UNBOUNDED_ETA if w.eta is None else w.eta
        self.sm = StalenessManager(eta, w.batch_prompts, w.max_concurrent, w.staleness_gate)
        self.submitted = 0
        self.running_versions: Counter[int] = Counter()
        self.ready: list[tuple[int, Group]] = []
        self.ready_versions: Counter[int] = Counter()
        # The first admission (time 0) starts every prompt at once; until all of them finished,
        # the pipeline is not in its steady state.
        self.burst = 0
        self.burst_left = 0

    def admit(self, now: float) -> None:
        cap = self.sm.capacity()
        if cap <= 0:
            return
        version = self.sm.version
        groups = [make_group(self.submitted + i, version, self.w.prompt_len, lengths)
                  for i, lengths in enumerate(self.lengths.take(cap))]
        if self.submitted == 0:
            self.burst = self.burst_left = cap
        self.submitted += cap
        self.sm.submit(cap)
        self.running_versions[version] += cap
        self.fleet.submit(groups, now)

    def finished(self, trajs: list[Trajectory]) -> None:
        for traj in trajs:
            group = traj.group
            group.left -= 1
            if group.left == 0:
                self.fleet.release(group)
                if group.ident < self.burst:
                    self.burst_left -= 1
                self.sm.accept()
                self.running_versions[group.version] -= 1
                self.ready_versions[group.version] += 1
                heapq.heappush(self.ready, (group.ident, group))

    def may_train(self) -> bool:
        """A batch is complete and the staleness gate lets it train now."""
        b = self.w.batch_prompts
        if len(self.ready) < b:
            return False
        if self.w.eta is None or not self.sm.strict:
            return True
        return gate_open(self.running_versions, self.ready_versions, b, self.sm.version, self.w.eta)

    def take_batch(self) -> list[Group]:
        batch = [heapq.heappop(self.ready)[1] for _ in range(self.w.batch_prompts)]
        for group in batch:
            self.ready_versions[group.version] -= 1
        return batch


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
    train_end = math.inf
    trainer_free = 0.0
    staleness = 0
    gen_busy_start = 0.0
    drained_at: float | None = None
    warmup: int | None = None

    def start_training(at: float) -> float:
        nonlocal staleness
        batch = ctl.take_batch()
        tok = sum(g.tokens for g in batch)
        staleness = max(staleness, ctl.sm.version - min(g.version for g in batch))
        tokens.append(tok)
        end = at + layout.train_s(cost, tok, sum(g.sq_tokens for g in batch), w.minibatches)
        trainer_busy.append((at, end))
        return end

    ctl.admit(0.0)
    while warmup is None or len(ends) < warmup + measured or ends[-1] - ends[warmup - 1] < drained_at:
        t_gen = fleet.next_time()
        if train_end <= t_gen:
            now, train_end = train_end, math.inf
            ends.append(now)
            if warmup is None and drained_at is not None and now >= 2.0 * drained_at:
                warmup = len(ends)
                gen_busy_start = fleet.busy_s(now)
            ctl.sm.set_version(ctl.sm.version + 1)
            update = layout.update_s(cost)
            fleet.interrupt(now, update, w.reprefill)
            trainer_free = now + update
            trainer_busy[-1] = (trainer_busy[-1][0], trainer_free)
            ctl.admit(now)
            if ctl.may_train():
                train_end = start_training(trainer_free)
        elif math.isinf(t_gen):
            raise RuntimeError("simulation stalled: no generation in flight and no batch to train")
        else:
            now, done = fleet.pop()
            ctl.finished(done)
            if drained_at is None and ctl.burst_left == 0:
                drained_at = now
            ctl.admit(now)
            if math.isinf(train_end) and ctl.may_train():
                train_end = start_training(max(now, trainer_free))
    return Run(
        step_ends=tuple(ends), step_tokens=tuple(tokens), warmup=warmup,
        gen_busy_gpu_s=(fleet.busy_s(ends[-1]) - gen_busy_start) * layout.gen_tp,
        train_busy_gpu_s=busy_in(trainer_busy, ends[warmup - 1], ends[-1]) * layout.train_gpus,
        gen_gpus=layout.gen_gpus, train_gpus=layout.train_gpus, colocated=False,
        max_staleness=staleness,
    )
