"""First-principles time of each piece of work: decode steps, prefill, training, weight transfer.

Counts come from the real model shape (configs/models/ through the config loader), hardware
numbers from hardware.py, and three global efficiencies (Efficiency) that calibration.py fits once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from areal_hpc.config.schema import ModelConfig
from areal_hpc.sim.hardware import Hardware

# Bytes of one fp16/bf16 value: inference weights, KV cache and training parameters (Table 3).
HALF = 2


@dataclass(frozen=True)
class ModelShape:
    """Parameter, FLOP and KV-cache counts of a Qwen2 decoder."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    tied_embeddings: bool
    head_dim: int

    @classmethod
    def from_config(cls, m: ModelConfig) -> ModelShape:
        return cls(m.num_layers, m.hidden_size, m.intermediate_size, m.num_attention_heads,
                   m.num_query_groups, m.vocab_size, m.tie_word_embeddings, m.head_size)

    @cached_property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @cached_property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @cached_property
    def layer_matmul_params(self) -> int:
        """q, k, v, o projections and the three SwiGLU matrices of one layer."""
        return self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden + 3 * self.hidden * self.ffn

    @cached_property
    def matmul_params(self) -> int:
        """Weights every token multiplies through: all layers plus the output projection."""
        return self.layers * self.layer_matmul_params + self.vocab * self.hidden

    @cached_property
    def params(self) -> int:
        """All parameters: matmuls, q/k/v biases, RMSNorm weights, embeddings."""
        per_layer = self.layer_matmul_params + self.q_dim + 2 * self.kv_dim + 2 * self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * per_layer + embeddings + self.hidden

    @cached_property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token, fp16."""
        return 2 * self.layers * self.kv_dim * HALF

    @cached_property
    def attn_flops_per_pair(self) -> int:
        """FLOPs of one (query, key) pair over all layers: QK^T and AV, 2 FLOPs per multiply-add."""
        return 4 * self.layers * self.q_dim


@dataclass(frozen=True)
class Efficiency:
    """The global efficiencies: calibration.py fits the first two on one row of Figure 4;
    `areal-hpc sim fit` fits all of them on measured runs (run_fit.py)."""

    # Fraction of HBM bandwidth and of peak FLOP/s a decode step reaches.
    decode: float
    # Fixed time of every decode step, seconds: scheduling, sampling, kernel launches.
    step_overhead_s: float
    # Model-FLOPs utilisation of training (dense compute), and of prefill unless prefill_mfu is set.
    mfu: float
    # Model-FLOPs utilisation of prefill and re-prefill; None: the training MFU.
    prefill_mfu: float | None = None
    # Fixed time of every weight update on top of its bytes over the link, seconds: pausing and
    # resuming the engines, loading the received tensors.
    update_overhead_s: float = 0.0

    @property
    def prefill(self) -> float:
        return self.mfu if self.prefill_mfu is None else self.prefill_mfu


@dataclass(frozen=True)
class DecodeStep:
    """Time of one decode step as a function of the total context S (tokens) in the batch:
    base + max(mem0 + mem1 * S, cmp0 + cmp1 * S). Constant while the batch's members are."""

    base: float
    mem0: float
    mem1: float
    cmp0: float
    cmp1: float

    def at(self, context: float) -> float:
        return self.base + max(self.mem0 + self.mem1 * context, self.cmp0 + self.cmp1 * context)


def micro_batches(tokens: float, dp: int, minibatches: int, micro_batch_tokens: int) -> tuple[int, int]:
    """Micro-batches of one replica in a PPO step: those of the proximal forward pass (its whole
    share packed into micro-batches of the token budget) and those of one forward-backward pass
    over a minibatch's share."""
    replica = tokens / dp
    return (max(1, math.ceil(replica / micro_batch_tokens)),
            max(1, math.ceil(replica / minibatches / micro_batch_tokens)))


def pipeline_stretch(pp: int, tokens: float, dp: int, minibatches: int, micro_batch_tokens: int) -> float:
    """How much pipeline bubbles lengthen a PPO step's compute (Megatron's 1F1B schedule): m
    micro-batches through pp stages take m + pp - 1 micro-batch slots of a stage, not m. The
    proximal forward pass is a quarter of the FLOPs, the forward-backward passes the other three
    quarters (micro_batches). 1 without pipeline parallelism; near 1 when micro-batches are many."""
    if pp <= 1:
        return 1.0
    prox, per_minibatch = micro_batches(tokens, dp, minibatches, micro_batch_tokens)
    return ((prox + pp - 1) / prox + 3.0 * (per_minibatch + pp - 1) / per_minibatch) / 4.0


def tp_collectives(layers: int, backward: bool) -> int:
    """Tensor-parallel all-reduces of one micro-batch through `layers` layers (Megatron without
    sequence parallelism; with it each becomes an all-gather and reduce-scatter pair, the same
    count of latencies): forward, the attention and MLP outputs of each layer, the vocab-parallel
    embedding and the three of the vocab-parallel log-probs (max, target logit, sum of exps);
    backward, the input gradients of each layer's two column-parallel matmuls and of the output
    layer."""
    forward = 2 * layers + 1 + 3
    return forward + (2 * layers + 1 if backward else 0)


def ring_allreduce_s(nbytes: float, ranks: int, bw: float) -> float:
    """Ring all-reduce: each rank sends and receives 2 (n-1)/n of the buffer."""
    return 0.0 if ranks <= 1 else 2.0 * (ranks - 1) / ranks * nbytes / bw


@dataclass(frozen=True)
class CostModel:
    """Seconds for each kind of work of one model on one hardware at given efficiencies."""

    shape: ModelShape
    hw: Hardware
    eff: Efficiency

    @cached_property
    def weight_bytes(self) -> int:
        return self.shape.params * HALF

    def link_bw(self, group_gpus: int) -> float:
        """NVLink inside a node, the network when a group spans nodes."""
        return self.hw.nvlink_bw if group_gpus <= self.hw.gpus_per_node else self.hw.net_bw

    def decode_step(self, n: int, tp: int) -> DecodeStep:
        """One decode step of an engine of `tp` GPUs with `n` running sequences.

        Memory: every weight and every cached K/V is read once per step. Compute: 2 FLOPs per
        weight per sequence, plus attention over the context. Tensor parallelism splits both and
        adds two all-reduces of the hidden states per layer.
        """
        s = self.shape
        bw = tp * self.hw.hbm_bw * self.eff.decode
        flops = tp * self.hw.peak_flops * self.eff.decode
        allreduce = 2 * s.layers * ring_allreduce_s(n * s.hidden * HALF, tp, self.hw.nvlink_bw)
        return DecodeStep(
            base=self.eff.step_overhead_s + allreduce,
            mem0=self.weight_bytes / bw,
            mem1=s.kv_bytes_per_token / bw,
            cmp0=2.0 * s.matmul_params * n / flops,
            cmp1=s.attn_flops_per_pair / flops,
        )

    def forward_flops(self, tokens: float, sq_sum: float) -> float:
        """FLOPs of a forward pass over sequences with `tokens` in all and sum of squared lengths
        `sq_sum` (causal attention: s^2 / 2 pairs per sequence)."""
        return 2.0 * self.shape.matmul_params * tokens + self.shape.attn_flops_per_pair * sq_sum / 2.0

    def prefill_s(self, tokens: float, sq_sum: float, tp: int) -> float:
        """Prefill (or re-prefill after an interruption) of contexts on one engine: compute-bound."""
        return self.forward_flops(tokens, sq_sum) / (tp * self.hw.peak_flops * self.eff.prefill)

    def train_s(self, tokens: float, sq_sum: float, gpus: int, dp: int, minibatches: int,
                model_gpus: int, pp: int = 1, micro_batch_tokens: int = 1) -> float:
        """One PPO step: a forward pass for the proximal log-probs, then forward and backward
        (twice a forward) over every token, at the MFU, lengthened by the pipeline bubbles of `pp`
        stages over micro-batches of `micro_batch_tokens` (pipeline_stretch); plus its
        communication (train_comm_s). `model_gpus` = tp * pp GPUs hold one model replica."""
        compute = 4.0 * self.forward_flops(tokens, sq_sum) / (gpus * self.hw.peak_flops * self.eff.mfu)
        compute *= pipeline_stretch(pp, tokens, dp, minibatches, micro_batch_tokens)
        return compute + self.train_comm_s(tokens, gpus, dp, minibatches, model_gpus, pp, micro_batch_tokens)

    def train_comm_s(self, tokens: float, gpus: int, dp: int, minibatches: int, model_gpus: int,
                     pp: int = 1, micro_batch_tokens: int = 1) -> float:
        """What a PPO step spends communicating rather than computing: one fp32 gradient
        all-reduce over the data-parallel ranks per minibatch (its bytes over the link), and the
        fixed latency of every collective on a replica's critical path. Latency counts: the
        tensor-parallel all-reduces of each micro-batch through a stage's layers (tp_collectives),
        one pipeline send and receive per micro-batch and direction, over the m + pp - 1 slots of
        the pipeline schedule; per minibatch the optimizer's reductions over the replica (gradient
        norm, overflow check) and the gradient all-reduce and parameter all-gather over dp. On the
        GPU presets this is small beside the compute; on CPU (gloo over TCP, ~11 ms a collective)
        it is most of what tensor parallelism adds to a step."""
        grad_bytes = 4.0 * self.shape.params / model_gpus
        sync = minibatches * ring_allreduce_s(grad_bytes, dp, self.link_bw(gpus))
        tp = model_gpus // pp
        prox, per_minibatch = micro_batches(tokens, dp, minibatches, micro_batch_tokens)
        stage_layers = math.ceil(self.shape.layers / pp)
        per_micro_fwd = (tp_collectives(stage_layers, backward=False) if tp > 1 else 0) + (1 if pp > 1 else 0)
        per_micro_fb = (tp_collectives(stage_layers, backward=True) if tp > 1 else 0) + (2 if pp > 1 else 0)
        latencies = (prox + pp - 1) * per_micro_fwd + minibatches * (per_minibatch + pp - 1) * per_micro_fb
        latencies += minibatches * ((2 if model_gpus > 1 else 0) + (2 if dp > 1 else 0))
        return sync + latencies * self.hw.collective_latency_s

    def broadcast_s(self, pp: int) -> float:
        """Trainer to generators over the network: each pipeline stage's leader broadcasts its
        share; a pipelined broadcast costs about bytes / bandwidth whatever the receiver count."""
        return self.eff.update_overhead_s + self.weight_bytes / pp / self.hw.net_bw

    def reshard_s(self, gpus: int) -> float:
        """Colocated switch from sharded training weights to whole inference weights: an
        all-gather of the fp16 weights over all GPUs."""
        return (gpus - 1) / gpus * self.weight_bytes / self.link_bw(gpus)
