"""`areal-hpc slurm verify`: a run's whole layout checked at its true shapes, without weights or GPUs.

Needs only the model's config.json (model.path/config.json, else the one config/hf.py writes for
the config's shape). In order:
1. mapping: the Hugging Face model of that config.json, built by transformers on the meta device,
   through convert.py both ways for every TP x PP rank: every tensor in exactly one pipeline
   stage, its TP shards of one shape adding up to it, and from_shards giving it back (fused q/k/v
   groups, SwiGLU halves, vocabulary slices, the tied embedding's copy on the last stage);
2. trainer: the Megatron shard of each distinct trainer rank, built by the trainer's own code at
   full size on the meta device (trainer/meta_build.py), holds exactly the mapped parameters,
   shapes and dtype, at the coordinates the rank map gives it;
3. weight update: each stage leader's plan of buckets as its sender announces it
   (trainer/hf_export.plan), the stage's weight group, and all stages' tensors together judged as
   every vLLM engine's receiver judges them (weight_transfer.mismatches), then vLLM's
   divisibility rules for the engines' tensor-parallel size;
4. memory (sim/memory.py) of a trainer GPU from the built shards' parameter counts and of a
   generator GPU from the Hugging Face model's, against the GPU's.
The launch preflight and `slurm plan` run steps 1 and 4 only (build=False): no megatron-core or
vLLM import.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from areal_hpc.config.hf import hf_config_dict, read_hf_config
from areal_hpc.config.schema import ExperimentConfig, ModelConfig
from areal_hpc.config.validate import generator_dtype
from areal_hpc.errors import listed
from areal_hpc.sim.cost_model import ModelShape
from areal_hpc.sim.hardware import Hardware, preset
from areal_hpc.sim.memory import ConfigMemory, config_memory, fixed_kv_tokens
from areal_hpc.slurm.hetjob import uses_gpus
from areal_hpc.trainer.convert import from_shards, hf_shapes, ignorable, stage_rules, to_shard
from areal_hpc.wire.layout import generator_ranks, trainer_ranks

Progress = Callable[[str], None]
# The GPU of the memory check where no --gpu is given: the launch preflight and a job script run
# directly read it from AREAL_GPU (slurm/hetjob.sh.in).
GPU_ENV = "AREAL_GPU"
DEFAULT_GPU = "h800"
# Bytes of one inference value (weights, KV cache) by generator.dtype.
VALUE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# vLLM's default KV-cache block (config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE on CUDA).
KV_BLOCK_TOKENS = 16
LAYER_SPEC = ("megatron-core's local layer spec (Transformer Engine's needs TE installed; its parameter names"
              " differ by convert.stage_rules(te_names=True)'s two norm renames, which each trainer checks at start)")
_LISTED = 5


def gpu_of(name: str | None) -> Hardware:
    """The GPU preset `name`, else the one AREAL_GPU names, else the paper's."""
    return preset(name or os.environ.get(GPU_ENV) or DEFAULT_GPU)


def build_device(cfg: ExperimentConfig) -> str:
    """The device whose trainer is checked: "cpu" on the CPU profile, else "cuda" (as the job's
    GPUs; slurm/hetjob.uses_gpus)."""
    return "cuda" if uses_gpus(cfg) else "cpu"


def hf_config_of(cfg: ExperimentConfig) -> dict:
    """model.path/config.json where it exists, else config/hf.py's for the config's shape."""
    path = cfg.model.path
    if path is not None and (Path(path) / "config.json").is_file():
        return read_hf_config(path)
    return hf_config_dict(cfg.model)


def hf_tensors(m: ModelConfig, hf: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors of the Hugging Face model of config.json `hf` (transformers, meta device), a tied
    output weight once as a checkpoint stores it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in hf.items() if k != "model_type"}
    config = AutoConfig.for_model(m.family, **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return dict(model.named_parameters())


def shape_tensors(m: ModelConfig, dtype: torch.dtype = torch.float16) -> dict[str, torch.Tensor]:
    """convert.hf_shapes(m) as meta tensors: the mapping's own view of a checkpoint."""
    return {n: torch.empty(s, dtype=dtype, device="meta") for n, s in hf_shapes(m).items()}


@dataclass(frozen=True)
class Mapping:
    """convert.py's rules applied to a model: per pipeline stage, the shapes of TP rank 0's shard by
    Megatron name (every TP rank's are alike where no problem says otherwise)."""

    stages: list[dict[str, tuple[int, ...]]]
    # Per stage, the parameters every TP rank holds whole (norm weights).
    replicated: list[set[str]]
    problems: list[str]
    hf_count: int

    def stage_params(self, stage: int) -> int:
        return sum(math.prod(s) for s in self.stages[stage].values())


def _shard_problems(rule, full: list[torch.Tensor], shards: list[torch.Tensor], m: ModelConfig,
                    stage: int) -> list[str]:
    where = f"stage {stage} {rule.megatron} ({rule.layout} of {', '.join(rule.hf)})"
    sizes = sorted({tuple(s.shape) for s in shards})
    if len(sizes) > 1:
        return [f"{where}: TP shards of unequal shapes {sizes}"]
    total = sum(t.numel() for t in full)
    held = shards[0].numel() * (1 if rule.layout == "replicated" else len(shards))
    if held != total:
        return [f"{where}: the TP shards hold {held} values of {total}"]
    back = [tuple(t.shape) for t in from_shards(rule, shards, m)]
    want = [tuple(t.shape) for t in full]
    if back != want:
        return [f"{where}: from_shards gives {back}, the Hugging Face tensors are {want}"]
    return []


def mapping(m: ModelConfig, tp: int, pp: int, hf: dict[str, torch.Tensor]) -> Mapping:
    """The rules of every stage and TP rank applied to the (meta) tensors `hf`, and what is wrong."""
    problems = []
    want = hf_shapes(m)
    wrong = sorted(n for n, t in hf.items() if n in want and tuple(t.shape) != want[n])
    if wrong:
        shapes = [f"{n} {list(hf[n].shape)} (convert.hf_shapes: {list(want[n])})" for n in wrong]
        problems.append(f"{len(wrong)} Hugging Face tensor(s) of another shape than convert.py expects:"
                        f" {listed(shapes, _LISTED)}")
    owner: dict[str, int] = {}
    stages, replicated = [], []
    for s in range(pp):
        shapes = {}
        replicated.append({r.megatron for r in stage_rules(m, s, pp) if r.layout == "replicated"})
        for rule in stage_rules(m, s, pp):
            for n in rule.hf if rule.exported else ():
                if n in owner:
                    problems.append(f"{n}: exported by stages {owner[n]} and {s}")
                owner[n] = s
            missing = [n for n in rule.hf if n not in hf]
            if missing:
                problems.append(f"stage {s} {rule.megatron}: maps from {', '.join(missing)}, not in the Hugging Face model")
            if missing or set(rule.hf) & set(wrong):
                continue
            full = [hf[n] for n in rule.hf]
            try:
                shards = [to_shard(rule, full, m, r, tp) for r in range(tp)]
                problems += _shard_problems(rule, full, shards, m, s)
            except RuntimeError as e:  # a reshape that the shapes do not allow
                problems.append(f"stage {s} {rule.megatron}: convert.py cannot split it over tp {tp}: {e}")
                continue
            shapes[rule.megatron] = tuple(shards[0].shape)
        stages.append(shapes)
    left = sorted(n for n in hf if n not in owner and not ignorable(m, n))
    if left:
        problems.append(f"{len(left)} Hugging Face tensor(s) in no pipeline stage: {listed(left, _LISTED)}")
    return Mapping(stages, replicated, problems, len(hf))


def build_problems(stage: int, built: dict[str, tuple[tuple[int, ...], torch.dtype]],
                   mapped: dict[str, tuple[int, ...]], dtype: torch.dtype, norms: set[str]) -> list[str]:
    """How the built shard of `stage` differs from the mapping (names, shapes) and the dtype. The
    local spec's norm weights (`norms`) are fp32 whatever the dtype (cpu_compat.RMSNorm);
    Transformer Engine's are in the training dtype."""
    where = f"trainer stage {stage}"
    problems = []
    unmapped, absent = sorted(built.keys() - mapped.keys()), sorted(mapped.keys() - built.keys())
    if unmapped:
        problems.append(f"{where}: {len(unmapped)} built parameter(s) without a convert.py rule: {listed(unmapped, _LISTED)}")
    if absent:
        problems.append(f"{where}: {len(absent)} convert.py rule(s) for parameters the model lacks: {listed(absent, _LISTED)}")
    wrong = [f"{n} {list(built[n][0])} (mapped {list(mapped[n])})"
             for n in sorted(built.keys() & mapped.keys()) if built[n][0] != mapped[n]]
    if wrong:
        problems.append(f"{where}: {len(wrong)} parameter(s) built in another shape than mapped: {listed(wrong, _LISTED)}")
    dtypes = sorted({str(d) for n, (_, d) in built.items() if n not in norms} - {str(dtype)})
    if dtypes:
        problems.append(f"{where}: parameters in {', '.join(dtypes)}, not the training dtype {dtype}")
    return problems


def vllm_problems(m: ModelConfig, tp: int) -> list[str]:
    """vLLM 0.32's divisibility rules for an engine of `tp` GPUs (its vocabulary padding by its own
    pad_vocab_size)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import pad_vocab_size

    key, problems = f"generator.tensor_parallel_size = {tp}", []
    # config/model.py ModelConfig.verify_with_parallel_config.
    if m.num_attention_heads % tp:
        problems.append(f"{key}: must divide model.num_attention_heads = {m.num_attention_heads} (vLLM)")
    # models/qwen2.py, qwen3.py, llama.py Attention: KV heads split over tp, or replicated when fewer.
    kv = m.num_query_groups
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        problems.append(f"{key}: vLLM splits model.num_query_groups = {kv} KV heads over its ranks, or replicates"
                        f" them when fewer: one must divide the other")
    # layers/vocab_parallel_embedding.py: the vocabulary padded to 64 rows, then divided over tp.
    padded = pad_vocab_size(m.vocab_size)
    if padded % tp:
        problems.append(f"{key}: must divide the vocabulary padded by vLLM (model.vocab_size = {m.vocab_size}"
                        f" -> {padded} rows)")
    # layers/linear.py MergedColumnParallelLinear: gate and up projections divided over tp.
    if m.intermediate_size % tp:
        problems.append(f"{key}: must divide model.intermediate_size = {m.intermediate_size} (vLLM)")
    return problems


@dataclass(frozen=True)
class StageUpdate:
    """One pipeline stage's weight update: its sender, buckets and weight group."""

    stage: int
    # MPI rank of the stage leader, rank 0 of the group.
    sender: int
    buckets: int
    bytes: int
    largest_bucket: int
    # Members: the sender and every vLLM worker of every generator (runtime/trainer_rank.py).
    world: int
    generators: tuple[int, ...]


def weight_update(cfg: ExperimentConfig, models: dict[int, torch.nn.Module],
                  hf: dict[str, torch.Tensor]) -> tuple[list[StageUpdate], list[str]]:
    """Every stage's bucket plan, built by the sender's own code from the stage's (meta) model
    (`models` by pp rank: a middle stage not built takes stage 1's), and the receivers' verdict."""
    from areal_hpc.rollout.weight_transfer import Header, mismatches
    from areal_hpc.trainer.hf_export import plan
    from areal_hpc.trainer.meta_build import stage_leader
    from areal_hpc.trainer.parallel import RankInfo

    t, g, m = cfg.trainer, cfg.generator, cfg.model
    generators = tuple(generator_ranks(cfg))
    world = 1 + len(generators) * g.tensor_parallel_size
    headers, out = [], []
    for s in range(t.pp):
        model = models[s if s in models else 1]
        buckets = plan(model, stage_rules(m, s, t.pp), m, RankInfo(0, t.tp, s, t.pp, 0, t.dp), g.weight_bucket_bytes)
        headers.append(Header.of(0, buckets))
        sizes = [sum(x.numel() * x.element_size() for _, x in b) for b in buckets]
        out.append(StageUpdate(s, trainer_ranks(cfg)[stage_leader(cfg, s)], len(buckets), sum(sizes),
                               max(sizes, default=0), world, generators))
    shapes = {n: tuple(x.shape) for n, x in hf.items()}
    return out, [f"weight update: {p}" for p in mismatches(headers, shapes, 0)]


@dataclass(frozen=True)
class KVCache:
    """One engine's KV cache against the sequences it must hold."""

    tokens: int
    # vLLM refuses to start unless one sequence of its max_model_len fits; rollout/engine_args.py
    # sets none, so it is config.json's max_position_embeddings.
    max_model_len: int
    longest_sequence: int

    @property
    def sequences(self) -> int:
        return max(0, self.tokens) // self.longest_sequence


def kv_cache(cfg: ExperimentConfig, mem: ConfigMemory) -> KVCache:
    g = cfg.generator
    tokens = mem.kv_tokens
    if not uses_gpus(cfg):  # the CPU profile's fixed cache
        tokens = fixed_kv_tokens(ModelShape.from_config(cfg.model), g.kv_cache_bytes, g.tensor_parallel_size,
                                 VALUE_BYTES[generator_dtype(cfg, "cpu")])
    return KVCache(tokens, cfg.model.max_position_embeddings, mem.longest_sequence)


def memory_problems(cfg: ExperimentConfig, mem: ConfigMemory, kv: KVCache, hw: Hardware) -> list[str]:
    """Memory over the GPU's, one line each naming the settings to change."""
    t, g, gb = cfg.trainer, cfg.generator, 1e9
    problems = []
    if uses_gpus(cfg) and mem.train_peak > mem.train_limit:
        stage = "first" if mem.first_stage_peak >= mem.last_stage_peak else "last"
        problems.append(
            f"trainer GPU: {mem.train_peak / gb:.1f} GB at the peak ({stage} pipeline stage), over the"
            f" {mem.train_limit / gb:.1f} GB usable of an {hw.name} ({hw.hbm_bytes / gb:.0f} GB): lower"
            f" trainer.micro_batch_tokens (now {t.micro_batch_tokens}), recompute more (trainer.recompute ="
            f" {t.recompute}) or raise trainer.tp / trainer.pp (now {t.tp} / {t.pp})")
    need = max(kv.max_model_len, kv.longest_sequence)
    if kv.tokens < need:
        fix = (f"raise generator.gpu_memory_utilization (now {g.gpu_memory_utilization}) or"
               f" generator.tensor_parallel_size (now {g.tensor_parallel_size})" if uses_gpus(cfg)
               else f"raise generator.kv_cache_bytes (now {g.kv_cache_bytes})")
        problems.append(
            f"generator KV cache: {max(0, kv.tokens)} tokens per engine, fewer than one sequence of {need}"
            f" (vLLM's max_model_len = model.max_position_embeddings = {kv.max_model_len}; the longest rollout"
            f" {kv.longest_sequence}): {fix}")
    return problems


@dataclass
class Report:
    """The outcome: problems (one line each, naming the setting) and the figures for the table."""

    cfg: ExperimentConfig
    hw: Hardware
    built: bool
    problems: list[str] = field(default_factory=list)
    hf_count: int = 0
    megatron_params: list[int] = field(default_factory=list)
    memory: ConfigMemory | None = None
    kv: KVCache | None = None
    updates: list[StageUpdate] = field(default_factory=list)
    # (pp rank, trainer rank, seconds) of each shard built.
    builds: list[tuple[int, int, float]] = field(default_factory=list)
    seconds: float = 0.0


def verify(cfg: ExperimentConfig, hw: Hardware, build: bool = True, progress: Progress = lambda _: None) -> Report:
    """Check cfg's layout; `build` False: the mapping and the memory only (no megatron-core, no vLLM)."""
    from areal_hpc.trainer.model import params_dtype

    start = time.perf_counter()
    t, m = cfg.trainer, cfg.model
    device = build_device(cfg)
    dtype = params_dtype(cfg, device)
    report = Report(cfg, hw, build)
    hf = hf_tensors(m, hf_config_of(cfg), dtype)
    mapped = mapping(m, t.tp, t.pp, hf)
    report.hf_count = mapped.hf_count
    report.problems += mapped.problems
    progress(f"mapping: {mapped.hf_count} Hugging Face tensors over {t.tp * t.pp} TP x PP shards,"
             f" {len(mapped.problems)} problem(s)")
    stage_params = [mapped.stage_params(s) for s in range(t.pp)]
    if build and not mapped.problems:
        models = _build(cfg, device, dtype, mapped, report, progress)
        stage_params = [sum(p.numel() for p in models[s if s in models else 1].parameters()) for s in range(t.pp)]
        if models.keys() == set(_stages(t.pp)):
            report.updates, problems = weight_update(cfg, models, hf)
            report.problems += problems
            progress(f"weight update: {sum(u.buckets for u in report.updates)} buckets over {t.pp} stage(s)")
        report.problems += vllm_problems(m, cfg.generator.tensor_parallel_size)
    report.megatron_params = stage_params
    report.memory = config_memory(cfg, hw, (stage_params[0], stage_params[-1]), sum(x.numel() for x in hf.values()))
    report.kv = kv_cache(cfg, report.memory)
    report.problems += memory_problems(cfg, report.memory, report.kv, hw)
    report.seconds = time.perf_counter() - start
    return report


def _stages(pp: int) -> list[int]:
    from areal_hpc.trainer.meta_build import distinct_stages

    return distinct_stages(pp)


def _build(cfg: ExperimentConfig, device: str, dtype: torch.dtype, mapped: Mapping, report: Report,
           progress: Progress) -> dict[int, torch.nn.Module]:
    """Build each distinct stage's shard; problems go to `report`. The models built, by pp rank."""
    from areal_hpc.trainer.meta_build import build_stage, stage_leader
    from areal_hpc.trainer.parallel import RankInfo

    t = cfg.trainer
    for s in range(1, t.pp - 1):  # middle stages are built once: their shards must be alike
        if mapped.stages[s] != mapped.stages[1]:
            report.problems.append(f"trainer stage {s}: mapped unlike stage 1, which alone is built")
    models = {}
    for s in _stages(t.pp):
        rank = stage_leader(cfg, s)
        progress(f"building trainer rank {rank} of {cfg.trainer_world} (stage {s} of {t.pp}) on the meta device")
        try:
            stage = build_stage(cfg, device, s)
        except Exception as e:  # megatron-core refusing the layout: a finding, not a crash
            report.problems.append(f"trainer stage {s}: megatron-core cannot build rank {rank}: {type(e).__name__}: {e}")
            continue
        want = RankInfo(0, t.tp, s, t.pp, 0, t.dp)
        if stage.ranks != want:
            report.problems.append(f"trainer rank {rank}: megatron-core places it at {stage.ranks}, the rank map"
                                   f" (wire/layout.py) at {want}")
        built = {n: (tuple(p.shape), p.dtype) for n, p in stage.model.named_parameters()}
        report.problems += build_problems(s, built, mapped.stages[s], dtype, mapped.replicated[s])
        report.builds.append((s, rank, stage.seconds))
        models[s] = stage.model
        progress(f"built rank {rank}: {stage.params:,} parameters in {stage.seconds:.1f} s")
    return models


def mapped_memory(cfg: ExperimentConfig, hw: Hardware) -> ConfigMemory:
    """config_memory with the parameters of the shards as mapped from the config's shape and of
    the whole model (what verify finds the built shards and the Hugging Face model hold): `slurm
    plan`'s memory line, without building anything."""
    tensors = shape_tensors(cfg.model)
    mapped = mapping(cfg.model, cfg.trainer.tp, cfg.trainer.pp, tensors)
    return config_memory(cfg, hw, (mapped.stage_params(0), mapped.stage_params(cfg.trainer.pp - 1)),
                         sum(t.numel() for t in tensors.values()))


@dataclass(frozen=True)
class StageMemory:
    """A trainer GPU of one pipeline stage (the first and the last: the others hold less)."""

    stage: int
    params: int
    states: float
    activations: float
    logits: float

    @property
    def peak(self) -> float:
        return self.states + self.activations + self.logits


def stage_memory(r: Report) -> list[StageMemory]:
    mem, pp = r.memory, r.cfg.trainer.pp
    assert mem is not None
    rows = [StageMemory(0, r.megatron_params[0], mem.train_states, mem.first_stage_activations,
                        mem.train_logits if pp == 1 else 0.0)]
    if pp > 1:
        rows.append(StageMemory(pp - 1, r.megatron_params[-1], mem.last_stage_states, mem.last_stage_activations,
                                mem.train_logits))
    return rows


def span(values: list[int]) -> str:
    return f"{values[0]}-{values[-1]}" if len(values) > 1 else str(values[0])


def as_dict(r: Report) -> dict[str, Any]:
    """The report as JSON-ready data (bytes in bytes)."""
    cfg, t, g = r.cfg, r.cfg.trainer, r.cfg.generator
    mem, kv = r.memory, r.kv
    data: dict[str, Any] = {
        "config": cfg.name, "ok": not r.problems, "problems": r.problems, "seconds": round(r.seconds, 2),
        "gpu": r.hw.name, "gpu_bytes": r.hw.hbm_bytes, "built": r.built, "layer_spec": LAYER_SPEC if r.built else None,
        "hf_tensors": r.hf_count,
    }
    if mem is None or kv is None:
        return data
    data["trainer"] = {
        "world": cfg.trainer_world, "tp": t.tp, "pp": t.pp, "dp": t.dp,
        "built_ranks": [{"stage": s, "rank": rank, "seconds": round(sec, 2)} for s, rank, sec in r.builds],
        "params_per_gpu": r.megatron_params, "estimated_params_per_gpu": mem.estimated_stage_params,
        "peak_bytes": mem.train_peak, "limit_bytes": mem.train_limit,
        "stages": [{"stage": row.stage, "params_per_gpu": row.params, "states_bytes": row.states,
                    "activation_bytes": row.activations, "logit_bytes": row.logits, "peak_bytes": row.peak}
                   for row in stage_memory(r)],
    }
    data["weight_update"] = [{"stage": u.stage, "sender_rank": u.sender, "buckets": u.buckets, "bytes": u.bytes,
                              "largest_bucket_bytes": u.largest_bucket, "group_world": u.world,
                              "generator_ranks": span(list(u.generators))} for u in r.updates]
    data["generator"] = {
        "engines": g.count, "tp": g.tensor_parallel_size, "reserved_bytes": mem.generator_reserved,
        "weight_bytes_per_gpu": mem.generator_weights, "kv_tokens_per_engine": kv.tokens,
        "kv_blocks": max(0, kv.tokens) // KV_BLOCK_TOKENS, "max_model_len": kv.max_model_len,
        "longest_sequence": kv.longest_sequence, "sequences_at_longest": kv.sequences, "max_num_seqs": g.max_num_seqs,
    }
    return data


def table(r: Report) -> str:
    """The report of a layout that passed, as text."""
    cfg, t, g, gb = r.cfg, r.cfg.trainer, r.cfg.generator, 1e9
    mem, kv = r.memory, r.kv
    assert mem is not None and kv is not None
    gpu = uses_gpus(cfg)
    where = f"{r.hw.name} {r.hw.hbm_bytes / gb:.0f} GB" if gpu else "CPU profile"
    lines = [f"{cfg.name}: verified at full size in {r.seconds:.1f} s ({where})"]
    if r.built:
        built = ", ".join(f"{rank} (stage {s}, {sec:.1f} s)" for s, rank, sec in r.builds)
        lines += [f"layers: {LAYER_SPEC}",
                  f"trainer: {cfg.trainer_world} ranks = tp {t.tp} x pp {t.pp} x dp {t.dp}; built on the meta device"
                  f" under a fake process group of {cfg.trainer_world}: ranks {built}"]
    lines.append(f"mapping: {r.hf_count} Hugging Face tensors, each in one stage, over {t.tp * t.pp} TP x PP shards;"
                 f" every Megatron parameter mapped, shapes equal")
    lines.append("  stage  params/GPU      estimate (error)            states  activations  logits  peak GB")
    for row in stage_memory(r):
        error = (mem.estimated_stage_params - row.params) / row.params
        lines.append(f"  {row.stage:<5}  {row.params:<14,}  {mem.estimated_stage_params:<14,.0f} ({error:+.2%})"
                     f"  {row.states / gb:>6.1f}  {row.activations / gb:>11.1f}  {row.logits / gb:>6.1f}"
                     f"  {row.peak / gb:>7.1f}")
    if gpu:
        lines.append(f"  trainer GPU peak {mem.train_peak / gb:.1f} GB of {mem.train_limit / gb:.1f} usable at"
                     f" {t.micro_batch_tokens}-token micro-batches, recompute {t.recompute}, log-probs in chunks of"
                     f" {t.logprob_chunk_tokens}")
    for u in r.updates:
        lines.append(f"weight update stage {u.stage}: {u.buckets} buckets, {u.bytes / gb:.2f} GB (largest"
                     f" {u.largest_bucket / gb:.2f}); group of {u.world}: sender rank {u.sender} + generators"
                     f" {span(list(u.generators))} x {g.tensor_parallel_size} workers")
    if r.built:
        lines.append(f"vLLM (tp {g.tensor_parallel_size}): heads, KV heads, padded vocabulary and MLP divide; every"
                     " engine receives each tensor of the model once, in its shape")
    kv_line = (f"KV cache {max(0, kv.tokens)} tokens per engine ({max(0, kv.tokens) // KV_BLOCK_TOKENS} blocks of"
               f" {KV_BLOCK_TOKENS}) = {kv.sequences} sequences of {kv.longest_sequence} (max_num_seqs"
               f" {g.max_num_seqs}); vLLM's max_model_len {kv.max_model_len} fits")
    if gpu:
        lines.append(f"generator GPU: {mem.generator_reserved / gb:.1f} GB reserved (gpu_memory_utilization"
                     f" {g.gpu_memory_utilization}): weights {mem.generator_weights / gb:.1f}; {kv_line}")
    else:
        lines.append(f"generator: {kv_line}")
    return "\n".join(lines)
