"""KV-cache capacity and out-of-memory detection."""

from __future__ import annotations

import pytest

from areal_hpc.sim.calibration import FITTED
from areal_hpc.sim.cost_model import CostModel, ModelShape
from areal_hpc.sim.hardware import H200, H800
from areal_hpc.sim.layout import Layout, memory_plan
from areal_hpc.sim.memory import kv_capacity_tokens, train_bytes_per_gpu
from areal_hpc.sim.predict import experiment, scaling, simulate
from areal_hpc.sim.workload import workload_from


def cost(model: str, hw=H800) -> CostModel:
    return CostModel(ModelShape.from_config(experiment(model).model), hw, FITTED)


def test_kv_capacity_by_hand():
    s = cost("1.5b").shape
    free = 0.85 * 80e9 - s.params * 2 - (8192 * (4 * 1536 + 3 * 8960) * 2 + 256 * 151936 * 4)
    assert kv_capacity_tokens(s, H800, 1, 0.85, 256) == int(free // 28_672)
    # more GPUs per engine: the weights split, the cache grows more than proportionally
    assert kv_capacity_tokens(s, H800, 2, 0.85, 256) > 2 * kv_capacity_tokens(s, H800, 1, 0.85, 256)


def test_32b_on_one_gpu_cannot_hold_its_kv_cache():
    c = cost("32b")
    w = workload_from(experiment("32b"))
    one_gpu = Layout(False, gpus=64, engines=48, gen_tp=1, train_tp=8, train_pp=2, train_dp=1)
    plan = memory_plan(one_gpu, c, w)
    assert not plan.fits
    assert "KV-cache tokens" in plan.problems[0]
    pred = simulate(experiment("32b"), one_gpu, w)
    assert pred.run is None and pred.tokens_per_s is None and pred.problems == plan.problems
    # the config's 4-GPU engines hold it; so does one H200 (141 GB) with its 8 KV heads
    four = Layout(False, gpus=64, engines=12, gen_tp=4, train_tp=8, train_pp=2, train_dp=1)
    assert memory_plan(four, c, w).fits
    assert memory_plan(one_gpu, cost("32b", H200), w).kv_tokens_per_engine > w.max_context


def test_training_memory_grows_with_micro_batch_and_shrinks_with_parallelism():
    s = cost("32b").shape
    small = train_bytes_per_gpu(s, 8, 2, 6, 16384)
    assert train_bytes_per_gpu(s, 8, 2, 6, 32768) > small
    assert train_bytes_per_gpu(s, 8, 4, 6, 16384) < small
    # FSDP over 256 GPUs keeps 18 bytes per parameter / 256 of states
    fsdp = train_bytes_per_gpu(s, 1, 1, 256, 1, shard_everything=True)
    assert fsdp == pytest.approx(18 * s.params / 256, rel=0.01)


def test_sync_32b_runs_out_of_memory_at_32k_but_not_16k():
    """The paper: the synchronous system cannot train the 32B model at a 32k context."""
    pred = scaling("32b", 32768, [256], "sync")[0]
    assert pred.run is None and "trainer GPU needs" in pred.problems[0]
    plan16 = memory_plan(Layout(True, 256, 64, 4, 1, 1, 256), cost("32b"), workload_from(experiment("32b"), 16384))
    assert plan16.fits
