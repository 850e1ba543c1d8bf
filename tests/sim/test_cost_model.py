"""Cost-model pieces against numbers computed by hand from the model shapes and datasheets."""

from __future__ import annotations

from dataclasses import replace

import pytest

from areal_hpc.errors import UserError
from areal_hpc.sim.cost_model import (
    CostModel,
    Efficiency,
    ModelShape,
    pipeline_stretch,
    ring_allreduce_s,
    tp_collectives,
)
from areal_hpc.sim.hardware import CPU, H100, H200, H800, Hardware, preset
from areal_hpc.sim.predict import experiment

# Round numbers so that every expected value below is checkable on paper.
TOY_HW = Hardware("toy", peak_flops=1e15, hbm_bytes=80e9, hbm_bw=2e12, nvlink_bw=100e9, net_bw=10e9,
                  collective_latency_s=0.0)
IDEAL = Efficiency(decode=1.0, step_overhead_s=0.0, mfu=1.0)


def shape(model: str) -> ModelShape:
    return ModelShape.from_config(experiment(model).model)


def test_qwen2_1p5b_counts_by_hand():
    s = shape("1.5b")
    # per layer: q 1536x1536, k and v 1536x256 each, o 1536x1536, SwiGLU 3 x 1536x8960
    layer = 1536 * 1536 + 2 * 1536 * 256 + 1536 * 1536 + 3 * 1536 * 8960
    assert s.layer_matmul_params == layer == 46_792_704
    biases_norms = 1536 + 2 * 256 + 2 * 1536
    embeddings = 2 * 151936 * 1536  # untied input and output
    assert s.params == 28 * (layer + biases_norms) + embeddings + 1536 == 1_777_088_000
    assert s.matmul_params == 28 * layer + 151936 * 1536
    assert s.kv_bytes_per_token == 2 * 28 * 2 * 128 * 2 == 28_672
    assert s.attn_flops_per_pair == 4 * 28 * 1536


def test_qwen2_32b_kv_and_size():
    s = shape("32b")
    assert s.kv_bytes_per_token == 2 * 64 * 8 * 128 * 2 == 262_144
    assert 32.5e9 < s.params < 33.0e9  # Qwen2.5-32B: 32.8B parameters


def test_decode_step_is_the_larger_of_memory_and_compute():
    s = shape("1.5b")
    cost = CostModel(s, TOY_HW, IDEAL)
    step = cost.decode_step(n=1, tp=1)
    weights = s.params * 2
    # one sequence with 10,000 tokens of context: memory-bound
    mem = (weights + s.kv_bytes_per_token * 10_000) / 2e12
    assert step.at(10_000) == pytest.approx(mem)
    # 4,096 sequences with no context yet: 2 FLOPs per weight per sequence dominate
    big = cost.decode_step(n=4096, tp=1)
    compute = 2 * s.matmul_params * 4096 / 1e15
    assert compute > weights / 2e12
    assert big.at(0) == pytest.approx(compute)


def test_decode_step_tensor_parallel_adds_allreduce_and_overhead():
    s = shape("7b")
    eff = Efficiency(decode=0.5, step_overhead_s=0.01, mfu=1.0)
    step = CostModel(s, TOY_HW, eff).decode_step(n=64, tp=2)
    # two all-reduces per layer of 64 x hidden fp16 values, ring over 2 GPUs: bytes / nvlink
    allreduce = 2 * 28 * (64 * 3584 * 2) / 100e9
    assert step.base == pytest.approx(0.01 + allreduce)
    assert step.mem0 == pytest.approx(s.params * 2 / (2 * 2e12 * 0.5))


def test_prefill_and_training_flops():
    s = shape("1.5b")
    cost = CostModel(s, TOY_HW, Efficiency(1.0, 0.0, 0.5))
    tokens, length = 1000, 1000
    forward = 2 * s.matmul_params * tokens + 4 * 28 * 1536 * length * length / 2
    assert cost.prefill_s(tokens, length**2, tp=2) == pytest.approx(forward / (2 * 1e15 * 0.5))
    # proximal forward + forward + backward (2 forwards) = 4 forwards; one replica: no all-reduce
    assert cost.train_s(tokens, length**2, gpus=4, dp=1, minibatches=4, model_gpus=4) == pytest.approx(
        4 * forward / (4 * 1e15 * 0.5))
    # 2 replicas in one node: + 4 fp32 gradient all-reduces of a whole replica's gradients over NVLink
    with_dp = cost.train_s(tokens, length**2, gpus=2, dp=2, minibatches=4, model_gpus=1)
    assert with_dp == pytest.approx(4 * forward / (2 * 1e15 * 0.5) + 4 * (4 * s.params) / 100e9)


def test_weight_transfer_by_hand():
    s = shape("32b")
    cost = CostModel(s, H800, IDEAL)
    assert cost.broadcast_s(pp=2) == pytest.approx(s.params * 2 / 2 / 50e9)
    # 16 GPUs span two nodes: the all-gather runs at the network's speed
    assert cost.reshard_s(16) == pytest.approx(15 / 16 * s.params * 2 / 50e9)
    assert ring_allreduce_s(1e9, 4, 1e9) == pytest.approx(1.5)
    assert ring_allreduce_s(1e9, 1, 1e9) == 0.0


def test_presets():
    assert preset("H800") is H800 and preset("h200") is H200
    assert H200.hbm_bytes > H100.hbm_bytes and H200.hbm_bw > H100.hbm_bw
    assert H800.nvlink_bw < H100.nvlink_bw
    with pytest.raises(UserError, match="unknown hardware"):
        preset("a100")


def test_pipeline_bubbles_stretch_training_by_hand():
    """1F1B: m micro-batches through pp stages take m + pp - 1 slots. 8,192 tokens on one replica,
    2 minibatches, 4,096-token micro-batches: the proximal pass has 2 micro-batches (3 slots for
    2), each minibatch 1 (2 slots for 1)."""
    assert pipeline_stretch(1, 8192, 1, 2, 4096) == 1.0
    assert pipeline_stretch(2, 8192, 1, 2, 4096) == pytest.approx((3 / 2 + 3 * 2 / 1) / 4)
    assert pipeline_stretch(2, 64 * 8192, 2, 2, 4096) == pytest.approx((65 / 64 + 3 * 33 / 32) / 4)
    s = shape("1.5b")
    cost = CostModel(s, TOY_HW, Efficiency(1.0, 0.0, 0.5))
    flat = cost.train_s(8192, 8192 * 512, gpus=2, dp=1, minibatches=2, model_gpus=2)
    piped = cost.train_s(8192, 8192 * 512, gpus=2, dp=1, minibatches=2, model_gpus=2, pp=2, micro_batch_tokens=4096)
    assert piped == pytest.approx(flat * pipeline_stretch(2, 8192, 1, 2, 4096))


def latencies(layout: dict, tokens: float = 8192) -> float:
    """Collective latencies of one PPO step of the 1.5B model: its train_s with a 1 s latency less
    its train_s with none."""
    s = shape("1.5b")
    slow = CostModel(s, replace(TOY_HW, collective_latency_s=1.0), IDEAL)
    fast = CostModel(s, TOY_HW, IDEAL)
    args = dict(minibatches=2, micro_batch_tokens=4096, **layout)
    return slow.train_s(tokens, tokens * 512, **args) - fast.train_s(tokens, tokens * 512, **args)


def test_collective_latencies_of_a_step_by_hand():
    """28 layers, 8,192 tokens, 2 minibatches of 4,096-token micro-batches: the proximal pass has
    2 micro-batches, each minibatch's forward-backward 1."""
    assert tp_collectives(28, backward=False) == 2 * 28 + 4 == 60
    assert tp_collectives(28, backward=True) == 60 + 2 * 28 + 1 == 117
    assert latencies(dict(gpus=1, dp=1, model_gpus=1)) == 0.0
    # tp 2: 60 all-reduces in each of 2 proximal micro-batches, 117 in each minibatch's one, and
    # per minibatch the gradient norm and overflow reductions over the replica.
    assert latencies(dict(gpus=2, dp=1, model_gpus=2)) == pytest.approx(2 * 60 + 2 * 117 + 2 * 2)
    # pp 2 (tp 1): a send per micro-batch forward, a send and a receive per forward-backward, over
    # m + pp - 1 slots.
    assert latencies(dict(gpus=2, dp=1, model_gpus=2, pp=2)) == pytest.approx((2 + 1) * 1 + 2 * (1 + 1) * 2 + 2 * 2)
    # dp 2: each replica has half the tokens (1 proximal micro-batch, 1 per minibatch) and adds the
    # gradient all-reduce and parameter all-gather per minibatch.
    assert latencies(dict(gpus=2, dp=2, model_gpus=1)) == pytest.approx(2 * 2)


def test_collective_latency_is_most_of_what_tp_adds_on_cpu_and_nothing_on_gpus():
    """The CPU miniature's tiny model (4 layers) at tp 2: about 70 gloo all-reduces of ~11 ms a
    step, the ~1 s that tp 2 measured over tp 1 (benchmarks/RESULTS.md, sim_validation). A 32B step
    on H800s (64 layers, tp 8 x pp 2 x dp 6, 8,192 trajectories of ~10k tokens): well under 1% of
    the step."""
    tiny = ModelShape(layers=4, hidden=128, ffn=384, heads=4, kv_heads=2, vocab=512, tied_embeddings=True, head_dim=32)
    cpu = CostModel(tiny, CPU, IDEAL)
    comm = cpu.train_comm_s(6300, gpus=2, dp=1, minibatches=2, model_gpus=2, micro_batch_tokens=4096)
    assert 0.6 < comm < 1.0
    big = CostModel(shape("32b"), H800, Efficiency(1.0, 0.0, 0.4))
    tokens = 8192 * 10_000
    args = dict(gpus=96, dp=6, minibatches=4, model_gpus=16, pp=2, micro_batch_tokens=32_768)
    comm = big.train_comm_s(tokens, **args)
    assert comm - big.train_comm_s(tokens, **{**args, "micro_batch_tokens": 10**12}) > 0  # latencies counted
    assert comm / big.train_s(tokens, tokens * 10_000, **args) < 0.01
