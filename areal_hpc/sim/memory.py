"""GPU memory: how many KV-cache tokens an engine holds, and whether training fits.

A layout is out of memory when an engine cannot hold one sequence of the full context (vLLM
refuses to start) or when a trainer GPU's model states plus activations exceed its HBM.
"""

from __future__ import annotations

from dataclasses import dataclass

from areal_hpc.sim.cost_model import HALF, ModelShape
from areal_hpc.sim.hardware import Hardware

# HBM a trainer process cannot use: CUDA context, NCCL buffers, allocator fragmentation.
TRAIN_RESERVE_FRACTION = 0.05
# Bytes per parameter of mixed-precision Adam: fp16 weights 2 and fp32 gradients 4 stay on every
# replica; fp32 master weights 4 and two Adam moments 8 can be sharded over data parallelism.
REPLICATED_STATE_BYTES = HALF + 4
SHARDABLE_STATE_BYTES = 4 + 8
# Per vocabulary entry of each token's logits: the fp16 output, its fp32 log-softmax and the
# fp32 gradient.
LOGIT_BYTES = HALF + 4 + 4
# Tokens vLLM prefills in one chunk (its max_num_batched_tokens), whose activations it reserves.
PREFILL_CHUNK_TOKENS = 8192


def kv_capacity_tokens(shape: ModelShape, hw: Hardware, tp: int, memory_utilization: float,
                       max_num_seqs: int, resident_bytes: float = 0.0) -> int:
    """KV-cache tokens one engine of `tp` GPUs holds: its share of HBM less its weight shard, the
    activations of a prefill chunk, fp32 logits of a full decode batch, and `resident_bytes` per
    GPU that another process keeps there (colocated training states). May be <= 0."""
    weights = shape.params * HALF / tp
    workspace = (PREFILL_CHUNK_TOKENS * (4 * shape.hidden + 3 * shape.ffn / tp) * HALF
                 + max_num_seqs * shape.vocab * 4 / tp)
    free = memory_utilization * hw.hbm_bytes - weights - workspace - resident_bytes
    return int(free * tp // shape.kv_bytes_per_token)


def train_bytes_per_gpu(shape: ModelShape, tp: int, pp: int, shards: int, micro_batch_tokens: int,
                        shard_everything: bool = False) -> float:
    """Peak bytes on the fullest trainer GPU with full activation recomputation.

    Megatron (shard_everything False): fp16 weights and fp32 gradients split by tp * pp, master
    weights and Adam moments also by the `shards` data-parallel ranks (distributed optimizer).
    FSDP / ZeRO-3 (True): every state split over `shards` GPUs. Activations: each layer's input
    is kept (the first pipeline stage holds pp micro-batches of its layers: all layers' worth),
    one layer is live with its gradients, and the last stage holds the logits.
    """
    p = shape.params
    if shard_everything:
        states = (REPLICATED_STATE_BYTES + SHARDABLE_STATE_BYTES) * p / shards
    else:
        states = p / (tp * pp) * (REPLICATED_STATE_BYTES + SHARDABLE_STATE_BYTES / shards)
    t = micro_batch_tokens
    checkpoint = t * shape.hidden * HALF
    live_layer = 2 * t * HALF * (4 * shape.hidden + (shape.q_dim + 2 * shape.kv_dim + 3 * shape.ffn) / tp)
    logits = t * shape.vocab / tp * LOGIT_BYTES
    first_stage = checkpoint * shape.layers
    last_stage = checkpoint * shape.layers / pp + logits
    return states + live_layer + max(first_stage, last_stage)


def train_limit_bytes(hw: Hardware) -> float:
    return hw.hbm_bytes * (1.0 - TRAIN_RESERVE_FRACTION)


@dataclass(frozen=True)
class MemoryPlan:
    """The memory verdict of a layout: KV capacity per engine, trainer peak, and why it fails."""

    kv_tokens_per_engine: int
    train_bytes_per_gpu: float
    problems: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return not self.problems
