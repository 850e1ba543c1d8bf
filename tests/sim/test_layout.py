"""Layouts from the experiment configs, concurrency scaling, and the calibration routine."""

from __future__ import annotations

import pytest

from areal_hpc.errors import UserError
from areal_hpc.sim.fit import nelder_mead
from areal_hpc.sim.layout import colocated_layout, split_layout
from areal_hpc.sim.predict import experiment, workload_for


def test_split_gives_three_quarters_to_generation_in_whole_replicas():
    cfg = experiment("32b")  # engines of 4 GPUs, trainer replicas of tp8 x pp2 = 16 GPUs
    lay = split_layout(cfg, 512)
    assert (lay.gen_gpus, lay.train_gpus) == (384, 128)
    assert (lay.engines, lay.gen_tp, lay.train_dp) == (96, 4, 8)
    # 48 nodes as in the config: 36 rollout nodes, 12 training nodes
    lay = split_layout(cfg, 384)
    assert (lay.gen_gpus, lay.train_dp) == (288, 6)
    with pytest.raises(UserError, match="trainer replica"):
        split_layout(cfg, 16)


def test_colocated_layout_uses_every_gpu_for_both():
    lay = colocated_layout(experiment("14b"), 64)
    assert lay.colocated and lay.engines == 32 and lay.train_gpus == 64 and lay.train_dp == 64
    with pytest.raises(UserError, match="multiple"):
        colocated_layout(experiment("14b"), 63)


def test_prompts_in_flight_scale_with_the_engines():
    cfg = experiment("1.5b")  # 96 engines and 1024 prompts in flight at 128 GPUs
    assert workload_for(cfg, split_layout(cfg, 128)).max_concurrent == 1024
    assert workload_for(cfg, split_layout(cfg, 256)).max_concurrent == 2048
    w = workload_for(cfg, split_layout(cfg, 128), context=16384)
    assert w.lengths.cap == 16384 - 1024 and w.batch_trajectories == 512 * 16


def test_nelder_mead_finds_a_quadratic_minimum():
    x, value = nelder_mead(lambda p: (p[0] - 1.5) ** 2 + 3 * (p[1] + 0.5) ** 2, [0.0, 0.0], 0.5, 200, 1e-12)
    assert x == pytest.approx([1.5, -0.5], abs=1e-4) and value < 1e-8
