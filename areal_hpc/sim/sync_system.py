"""Synchronous RL: generate a whole batch, wait for its longest sequence, train, update weights,
repeat. Colocated (verl-like): all GPUs generate, then all train with FSDP, then reshard.
Split: the asynchronous system's GPUs run the same schedule (its eta = 0 special case)."""

from __future__ import annotations

from areal_hpc.sim.async_system import busy_in
from areal_hpc.sim.cost_model import CostModel
from areal_hpc.sim.engine import Fleet, make_group
from areal_hpc.sim.layout import Layout
from areal_hpc.sim.lengths import LengthStream
from areal_hpc.sim.run import Run
from areal_hpc.sim.workload import Workload


def run_sync(layout: Layout, cost: CostModel, w: Workload, fleet: Fleet, steps: int, warmup: int,
             lengths: LengthStream) -> Run:
    """Simulate `steps` steps, each on the next `w.batch_prompts` groups of the length stream."""
    ends: list[float] = []
    tokens: list[int] = []
    trainer_busy: list[tuple[float, float]] = []
    gen_busy_start = 0.0
    now = 0.0
    for step in range(steps):
        groups = [make_group(step * w.batch_prompts + i, step, w.prompt_len, ls)
                  for i, ls in enumerate(lengths.take(w.batch_prompts))]
        fleet.submit(groups, now)
        left = w.batch_trajectories
        while left:
            gen_end, done = fleet.pop()
            left -= len(done)
        gen_end += w.reward_s  # the last sample's score
        for group in groups:
            fleet.release(group)
        tok = sum(g.tokens for g in groups)
        end = gen_end + layout.train_s(cost, tok, sum(g.sq_tokens for g in groups), w.minibatches,
                                        w.micro_batch_tokens)
        ends.append(end)
        tokens.append(tok)
        if len(ends) == warmup:
            gen_busy_start = fleet.busy_s(end)
        now = end + layout.update_s(cost)
        trainer_busy.append((gen_end, now))
    start = ends[warmup - 1] if warmup else 0.0
    return Run(
        step_ends=tuple(ends), step_tokens=tuple(tokens), warmup=warmup,
        gen_busy_gpu_s=(fleet.busy_s(ends[-1]) - gen_busy_start) * layout.gen_tp,
        train_busy_gpu_s=busy_in(trainer_busy, start, ends[-1]) * layout.train_gpus,
        gen_gpus=layout.gen_gpus, train_gpus=layout.train_gpus, colocated=layout.colocated,
        max_staleness=0,
    )
