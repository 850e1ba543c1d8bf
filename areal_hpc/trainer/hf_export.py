"""Full Hugging Face tensors out of TP/PP shards: the stream to the generators and HF export.

Per pipeline stage, each parameter's tensor-parallel shards are gathered on the stage leader
(tp_rank 0 of data-parallel replica 0) and turned into Hugging Face tensors by the rules of
convert.py, a bucket at a time, so no rank ever holds more than its stage plus one bucket.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from areal_hpc.config.schema import ModelConfig
from areal_hpc.trainer.convert import Rule, from_shards
from areal_hpc.trainer.hf_checkpoint import write_index, write_model_files, write_tensors
from areal_hpc.trainer.parallel import RankInfo

# Bucket size of export_hf's files (Hugging Face shards are typically a few GiB).
EXPORT_BUCKET_BYTES = 2 * 2**30


def _full_bytes(param: torch.Tensor, rule: Rule, tp_size: int) -> int:
    copies = 1 if rule.layout == "replicated" else tp_size
    return param.numel() * copies * param.element_size()


def plan_buckets(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Consecutive indices grouped so each group's bytes stay within bucket_bytes (or one item)."""
    buckets: list[list[int]] = []
    used = 0
    for i, size in enumerate(sizes):
        if not buckets or used + size > bucket_bytes:
            buckets.append([])
            used = 0
        buckets[-1].append(i)
        used += size
    return buckets


def _gather(shard: torch.Tensor, rule: Rule, ranks: RankInfo) -> list[torch.Tensor] | None:
    """All TP shards of one parameter on the stage leader, None elsewhere."""
    from megatron.core import parallel_state

    if ranks.dp_rank != 0:
        return None
    if rule.layout == "replicated" or ranks.tp_size == 1:
        return [shard] if ranks.tp_rank == 0 else None
    shard = shard.contiguous()
    parts = [torch.empty_like(shard) for _ in range(ranks.tp_size)] if ranks.tp_rank == 0 else None
    dist.gather(shard, parts, dst=parallel_state.get_tensor_model_parallel_src_rank(),
                group=parallel_state.get_tensor_model_parallel_group())
    return parts


def _rule_buckets(params: dict[str, torch.nn.Parameter], rules: list[Rule], ranks: RankInfo,
                  bucket_bytes: int) -> list[list[Rule]]:
    """The exported rules of this stage, grouped as the stream yields them."""
    exported = [r for r in rules if r.exported]
    sizes = [_full_bytes(params[r.megatron], r, ranks.tp_size) for r in exported]
    return [[exported[i] for i in bucket] for bucket in plan_buckets(sizes, bucket_bytes)]


def stream(model: torch.nn.Module, rules: list[Rule], m: ModelConfig, ranks: RankInfo, bucket_bytes: int,
           tensor_of: Callable[[torch.nn.Parameter], torch.Tensor] = torch.Tensor.detach,
           ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """See TrainEngine.iter_hf_weights; `tensor_of` picks what to stream of each parameter (its
    value, or e.g. its gradient)."""
    params = dict(model.named_parameters())
    for bucket in _rule_buckets(params, rules, ranks, bucket_bytes):
        out: list[tuple[str, torch.Tensor]] = []
        for rule in bucket:
            with torch.no_grad():
                shards = _gather(tensor_of(params[rule.megatron]), rule, ranks)
            if shards is not None:
                out += zip(rule.hf, from_shards(rule, shards, m), strict=True)
        yield out


def plan(model: torch.nn.Module, rules: list[Rule], m: ModelConfig, ranks: RankInfo,
         bucket_bytes: int) -> list[list[tuple[str, torch.Tensor]]]:
    """What `stream` yields on the stage leader, as meta tensors (names, dtypes, shapes; no data,
    no communication): a weight sender announces it before the first bucket is gathered."""
    params = dict(model.named_parameters())
    out = []
    for bucket in _rule_buckets(params, rules, ranks, bucket_bytes):
        planned: list[tuple[str, torch.Tensor]] = []
        for rule in bucket:
            p = params[rule.megatron]
            copies = 1 if rule.layout == "replicated" else ranks.tp_size
            shards = [torch.empty(p.shape, dtype=p.dtype, device="meta")] * copies
            planned += zip(rule.hf, from_shards(rule, shards, m), strict=True)
        out.append(planned)
    return out


def export(out_dir: Path, buckets: Iterable[list[tuple[str, torch.Tensor]]], m: ModelConfig, ranks: RankInfo,
           dtype: torch.dtype, token_ids: dict[str, int | list[int]], tokenizer_dir: Path | None) -> Path:
    """Write the stream as a sharded Hugging Face directory; collective over all trainer ranks."""
    if dist.get_rank() == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in out_dir.glob("*.safetensors"):
            stale.unlink()
    dist.barrier()
    weight_map: dict[str, str] = {}
    total = 0
    for k, bucket in enumerate(buckets):
        if bucket:
            name = f"model-pp{ranks.pp_rank:02d}-{k:05d}.safetensors"
            write_tensors(out_dir, name, dict(bucket))
            weight_map.update({n: name for n, _ in bucket})
            total += sum(t.numel() * t.element_size() for _, t in bucket)
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, (weight_map, total))
    if dist.get_rank() == 0:
        merged = {n: f for part, _ in parts for n, f in part.items()}
        write_index(out_dir, merged, sum(size for _, size in parts))
        write_model_files(out_dir, m, dtype, token_ids, tokenizer_dir)
    dist.barrier()
    return out_dir
