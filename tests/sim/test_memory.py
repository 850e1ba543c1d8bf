"""KV-cache capacity and out-of-memory detection."""

from __future__ import annotations

import pytest

from areal_hpc.sim.calibration import FITTED
from areal_hpc.sim.cost_model import CostModel, ModelShape
from areal_hpc.sim.hardware import H200, H800
from areal_hpc.sim.layout import Layout, memory_plan
from areal_hpc.sim.memory import (
    Recompute,
    activation_bytes,
    config_memory,
    kv_capacity_tokens,
    layer_activation_bytes,
    logit_bytes,
    train_bytes_per_gpu,
)
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


PAPER = ("math-1.5b", "math-7b", "code-14b", "code-32b")


def paper_config(name: str, *overrides: str):
    from areal_hpc.config.load import load_config

    return load_config(f"configs/experiments/{name}.yaml", list(overrides), check_files=False)


def test_layer_activations_by_hand():
    s = cost("32b").shape  # hidden 5120, 40 heads of 128, 8 KV heads, ffn 27648
    assert layer_activation_bytes(s, 8, False, False) == 2 * (4 * 5120 + (2 * 5120 + 2 * 1024 + 3 * 27648) / 8)
    assert layer_activation_bytes(s, 8, True, False) == 2 * (4 * 5120 / 8 + (2 * 5120 + 2 * 1024 + 3 * 27648) / 8)
    assert layer_activation_bytes(s, 8, False, True) == 2 * (3 * 5120 + (2 * 5120 + 2 * 1024) / 8)


def test_recomputation_orders_activations_and_its_variants_agree():
    s, t = cost("7b").shape, 32768
    none, selective, full = (activation_bytes(s, 2, 1, t, Recompute(mode))[0] for mode in ("none", "selective", "full"))
    assert none > selective > full
    # block over every layer of the stage is uniform groups of one layer
    assert activation_bytes(s, 2, 1, t, Recompute("full", "block")) == activation_bytes(s, 2, 1, t, Recompute("full"))
    # block over no more than some layers keeps the rest whole
    assert activation_bytes(s, 2, 1, t, Recompute("full", "block", 4))[0] > full
    # the first of 2 pipeline stages holds 2 micro-batches of half the layers; the last one
    first, last = activation_bytes(s, 2, 2, t, Recompute("none"))
    assert first > last and first == pytest.approx(none, rel=0.1)


def test_chunked_logits_never_hold_fp32_for_the_whole_micro_batch():
    s = cost("1.5b").shape
    whole = logit_bytes(s, 1, 32768, None)
    assert whole == 32768 * 151936 * 10
    assert logit_bytes(s, 1, 32768, 2048) == 32768 * 151936 * 4 + 2048 * 151936 * 8
    assert logit_bytes(s, 1, 100, 2048) == logit_bytes(s, 1, 100, 100)


@pytest.mark.parametrize("name", PAPER)
def test_paper_configs_fit_an_h800_only_with_their_recomputation(name):
    cfg = paper_config(name)
    assert cfg.trainer.recompute == "full"
    m = config_memory(cfg, H800)
    assert m.train_peak < m.train_limit
    kept = config_memory(paper_config(name, "trainer.recompute=none"), H800)
    assert kept.train_peak > kept.train_limit
    # the generators hold at least one whole sequence
    assert m.kv_tokens >= m.longest_sequence


def test_unchunked_log_probs_would_not_fit_the_1p5b_trainer():
    chunked = config_memory(paper_config("math-1.5b"), H800)
    whole = config_memory(paper_config("math-1.5b", "trainer.logprob_chunk_tokens=32768"), H800)
    assert whole.train_logits - chunked.train_logits > 30e9
    assert chunked.train_peak < chunked.train_limit < whole.train_peak
