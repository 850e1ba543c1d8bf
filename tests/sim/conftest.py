"""Small simulated setups (a few engines, short traces) that run in milliseconds."""

from __future__ import annotations

import numpy as np

from areal_hpc.sim.calibration import FITTED
from areal_hpc.sim.cost_model import CostModel, ModelShape
from areal_hpc.sim.hardware import H800
from areal_hpc.sim.layout import Layout, make_fleet, memory_plan
from areal_hpc.sim.lengths import LengthDistribution, LengthStream
from areal_hpc.sim.predict import experiment
from areal_hpc.sim.workload import Workload

SMALL = Workload(
    batch_prompts=8, group_size=4, prompt_len=64, max_prompt_len=128,
    lengths=LengthDistribution(median=300.0, sigma=0.8, cap=1024, prompt_share=0.5),
    eta=2, staleness_gate="strict", max_concurrent=64, max_num_seqs=64, minibatches=2, micro_batch_tokens=4096,
    memory_utilization=0.85, reprefill=True,
)


def cost_1p5b() -> CostModel:
    return CostModel(ModelShape.from_config(experiment("1.5b").model), H800, FITTED)


def split(engines: int, train_dp: int = 1) -> Layout:
    return Layout(False, gpus=engines + train_dp, engines=engines, gen_tp=1, train_dp=train_dp)


def fleet_for(layout: Layout, cost: CostModel, w: Workload = SMALL):
    return make_fleet(layout, cost, memory_plan(layout, cost, w), w)


def stream(w: Workload = SMALL, seed: int = 0) -> LengthStream:
    return LengthStream(w.lengths, w.group_size, np.random.default_rng(seed))


class FixedLengths:
    """A length stream that hands out given groups in order."""

    def __init__(self, groups: list[list[int]]):
        self.groups = list(groups)

    def take(self, n: int) -> list[list[int]]:
        out, self.groups = self.groups[:n], self.groups[n:]
        return out
