"""GPU memory: how many KV-cache tokens an engine holds, and whether training fits.

A layout is out of memory when an engine cannot hold one sequence of the full context (vLLM
refuses to start) or when a trainer GPU's model states plus activations exceed its HBM. The one
place of this arithmetic: the simulator's layouts, `areal-hpc slurm plan` and `slurm verify`
(config_memory) all ask it. Parameter counts are the analytic ModelShape's unless the caller passes
those of the real model (verify: the built Megatron shards and the Hugging Face model).
"""

from __future__ import annotations

from dataclasses import dataclass

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.sim.cost_model import HALF, ModelShape
from areal_hpc.sim.hardware import Hardware

# HBM a trainer process cannot use: CUDA context, NCCL buffers, allocator fragmentation.
TRAIN_RESERVE_FRACTION = 0.05
# Bytes per parameter of mixed-precision Adam: fp16 weights 2 and fp32 gradients 4 stay on every
# replica; fp32 master weights 4 and two Adam moments 8 can be sharded over data parallelism.
REPLICATED_STATE_BYTES = HALF + 4
SHARDABLE_STATE_BYTES = 4 + 8
# Per vocabulary entry of each token's logits, log-probs taken from all of them at once: the fp16
# output, its fp32 log-softmax and the fp32 gradient.
LOGIT_BYTES = HALF + 4 + 4
# Chunked (trainer/logprobs.py): the fp16 output and its fp16 gradient for every token, and for
# one chunk of tokens two fp32 buffers (the upcast chunk, its softmax / gradient).
CHUNKED_LOGIT_BYTES = HALF + HALF
CHUNK_LOGIT_BYTES = 4 + 4
# Tokens vLLM prefills in one chunk (its max_num_batched_tokens), whose activations it reserves.
PREFILL_CHUNK_TOKENS = 8192


def kv_capacity_tokens(shape: ModelShape, hw: Hardware, tp: int, memory_utilization: float,
                       max_num_seqs: int, resident_bytes: float = 0.0, params: int | None = None) -> int:
    """KV-cache tokens one engine of `tp` GPUs holds: its share of HBM less its weight shard, the
    activations of a prefill chunk, fp32 logits of a full decode batch, and `resident_bytes` per
    GPU that another process keeps there (colocated training states). May be <= 0. `params`: the
    model's parameter count (default the shape's estimate)."""
    weights = generator_weight_bytes(shape, tp, params)
    workspace = (PREFILL_CHUNK_TOKENS * (4 * shape.hidden + 3 * shape.ffn / tp) * HALF
                 + max_num_seqs * shape.vocab * 4 / tp)
    free = memory_utilization * hw.hbm_bytes - weights - workspace - resident_bytes
    return int(free * tp // shape.kv_bytes_per_token)


def generator_weight_bytes(shape: ModelShape, tp: int, params: int | None = None) -> float:
    """Bytes of one engine GPU's weight shard (fp16/bf16)."""
    return (shape.params if params is None else params) * HALF / tp


def fixed_kv_tokens(shape: ModelShape, cache_bytes: int, tp: int, value_bytes: int) -> int:
    """KV-cache tokens of an engine whose `tp` workers each hold `cache_bytes` of cache (the CPU
    profile's generator.kv_cache_bytes), values of `value_bytes` bytes."""
    return int(cache_bytes * tp // (shape.kv_bytes_per_token // HALF * value_bytes))


@dataclass(frozen=True)
class Recompute:
    """trainer.recompute and its options (config/schema.py TrainerConfig), as the memory needs them."""

    # "none", "selective" or "full".
    mode: str = "full"
    # With full: "uniform" or "block", and recompute_num_layers (None: 1 / the whole stage).
    method: str = "uniform"
    num_layers: int | None = None
    # With selective: the recomputed modules.
    modules: tuple[str, ...] = ("mlp",)


def layer_activation_bytes(shape: ModelShape, tp: int, sequence_parallel: bool, mlp_recomputed: bool) -> float:
    """Bytes one layer keeps per token for its backward pass (Transformer Engine spec, flash
    attention, fp16/bf16): the inputs and outputs of the two fused norm-linears (4 x hidden,
    replicated over tp ranks unless sequence parallel); rotated q, k, v and the attention output
    (split over tp); the SwiGLU's fc1 output and activation (3 x ffn, split over tp). With the MLP
    recomputed only its input (hidden) stays of the MLP's part."""
    replicated = (3 if mlp_recomputed else 4) * shape.hidden / (tp if sequence_parallel else 1)
    split = (2 * shape.q_dim + 2 * shape.kv_dim + (0 if mlp_recomputed else 3 * shape.ffn)) / tp
    return HALF * (replicated + split)


def activation_bytes(shape: ModelShape, tp: int, pp: int, tokens: int, recompute: Recompute,
                     sequence_parallel: bool = False) -> tuple[float, float]:
    """(first stage, last stage) activation bytes of a stage's layers under 1F1B, without logits.

    The first stage holds pp micro-batches in flight, the last one. Kept: per recomputed layer
    its input only (hidden per token; split with sequence parallelism), per other layer
    layer_activation_bytes. Live during the backward pass: the recomputed group's full
    activations and one layer's gradient transients (as much as its activations again)."""
    stage_layers = shape.layers // pp
    full = layer_activation_bytes(shape, tp, sequence_parallel, mlp_recomputed=False) * tokens
    if recompute.mode == "full":
        checkpoint = HALF * shape.hidden / (tp if sequence_parallel else 1) * tokens
        if recompute.method == "uniform":
            group = recompute.num_layers or 1
            kept, live = checkpoint * stage_layers / group, full * (group + 1)
        else:
            recomputed = min(recompute.num_layers or stage_layers, stage_layers)
            kept, live = checkpoint * recomputed + full * (stage_layers - recomputed), full * 2
    else:
        mlp = recompute.mode == "selective" and "mlp" in recompute.modules
        kept, live = layer_activation_bytes(shape, tp, sequence_parallel, mlp) * tokens * stage_layers, full
    return kept * pp + live, kept + live


def logit_bytes(shape: ModelShape, tp: int, tokens: int, chunk_tokens: int | None) -> float:
    """Last stage: the logits of a micro-batch and what log-probs and their gradient need, all at
    once (chunk_tokens None) or chunked (trainer/logprobs.py)."""
    entries = tokens * shape.vocab / tp
    if chunk_tokens is None:
        return entries * LOGIT_BYTES
    return entries * CHUNKED_LOGIT_BYTES + min(chunk_tokens, tokens) * shape.vocab / tp * CHUNK_LOGIT_BYTES


def state_bytes(shape: ModelShape, tp: int, pp: int, shards: int, shard_everything: bool = False,
                shard_params: float | None = None) -> float:
    """Model states per GPU. Megatron (shard_everything False): fp16 weights and fp32 gradients
    split by tp * pp, master weights and Adam moments also by the `shards` data-parallel ranks
    (distributed optimizer; 1 without). FSDP / ZeRO-3 (True): every state split over `shards`.
    `shard_params`: the parameters of this GPU's Megatron shard as built (default: an even split
    of the shape's estimate over tp * pp)."""
    p = shape.params
    if shard_everything:
        return (REPLICATED_STATE_BYTES + SHARDABLE_STATE_BYTES) * p / shards
    per_gpu = p / (tp * pp) if shard_params is None else shard_params
    return per_gpu * (REPLICATED_STATE_BYTES + SHARDABLE_STATE_BYTES / shards)


def train_bytes_per_gpu(shape: ModelShape, tp: int, pp: int, shards: int, micro_batch_tokens: int,
                        shard_everything: bool = False, recompute: Recompute = Recompute(),
                        sequence_parallel: bool = False, logprob_chunk_tokens: int | None = None) -> float:
    """Peak bytes on the fullest trainer GPU: states, activations (full recomputation unless
    told otherwise) and, on the last stage, the logits (all at once unless chunked)."""
    first, last = activation_bytes(shape, tp, pp, micro_batch_tokens, recompute, sequence_parallel)
    logits = logit_bytes(shape, tp, micro_batch_tokens, logprob_chunk_tokens)
    states = state_bytes(shape, tp, pp, shards, shard_everything)
    return states + max(first, last + logits)


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


def recompute_of(cfg: ExperimentConfig) -> Recompute:
    t = cfg.trainer
    return Recompute(t.recompute, t.recompute_method, t.recompute_num_layers, tuple(t.recompute_modules))


@dataclass(frozen=True)
class ConfigMemory:
    """Estimated peak memory of one experiment's GPUs (`areal-hpc slurm plan` and `verify`)."""

    # Trainer GPU: model states of the first and of the last pipeline stage (the same stage when
    # pp = 1), their activations, the last stage's logits, and the usable HBM. Middle stages hold
    # fewer states and micro-batches than the first.
    train_states: float
    last_stage_states: float
    first_stage_activations: float
    last_stage_activations: float
    train_logits: float
    train_limit: float
    # Parameters per GPU of the first and the last stage's shard (as given, else the estimate's
    # even split), and the estimate's even split.
    first_stage_params: float
    last_stage_params: float
    estimated_stage_params: float
    # Generator GPU: vLLM reserves gpu_memory_utilization of HBM; of it the weight shard, the
    # workspace and the KV cache, which holds kv_tokens per engine.
    generator_reserved: float
    generator_weights: float
    kv_tokens: int
    longest_sequence: int

    @property
    def first_stage_peak(self) -> float:
        return self.train_states + self.first_stage_activations

    @property
    def last_stage_peak(self) -> float:
        return self.last_stage_states + self.last_stage_activations + self.train_logits

    @property
    def train_peak(self) -> float:
        return max(self.first_stage_peak, self.last_stage_peak)


def config_memory(cfg: ExperimentConfig, hw: Hardware, stage_params: tuple[int, int] | None = None,
                  model_params: int | None = None) -> ConfigMemory:
    """The memory of cfg's layout on `hw`, micro-batches of trainer.micro_batch_tokens.
    `stage_params`: the parameters per GPU of the first and the last stage's shard as built;
    `model_params`: the whole model's (what each engine holds); default: the shape's estimates."""
    shape = ModelShape.from_config(cfg.model)
    t, g = cfg.trainer, cfg.generator
    tokens = t.micro_batch_tokens
    shards = t.dp if t.distributed_optimizer else 1
    first, last = activation_bytes(shape, t.tp, t.pp, tokens, recompute_of(cfg), t.sequence_parallel)
    logits = logit_bytes(shape, t.tp, tokens, t.logprob_chunk_tokens)
    even = shape.params / (t.tp * t.pp)
    first_params, last_params = stage_params or (even, even)
    return ConfigMemory(
        train_states=state_bytes(shape, t.tp, t.pp, shards, shard_params=first_params),
        last_stage_states=state_bytes(shape, t.tp, t.pp, shards, shard_params=last_params),
        first_stage_activations=first, last_stage_activations=last, train_logits=logits,
        train_limit=train_limit_bytes(hw),
        first_stage_params=first_params, last_stage_params=last_params, estimated_stage_params=even,
        generator_reserved=g.gpu_memory_utilization * hw.hbm_bytes,
        generator_weights=generator_weight_bytes(shape, g.tensor_parallel_size, model_params),
        kv_tokens=kv_capacity_tokens(shape, hw, g.tensor_parallel_size, g.gpu_memory_utilization, g.max_num_seqs,
                                     params=model_params),
        longest_sequence=cfg.rollout.max_prompt_len + cfg.rollout.max_new_tokens,
    )
