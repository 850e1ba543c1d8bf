"""Offline export of a trainer checkpoint (megatron-core torch_dist) to a Hugging Face directory.

One process and no process group, whatever TP/PP/DP layout wrote the checkpoint: its metadata
(torch.distributed.checkpoint) names every model tensor with its global shape. Megatron saves a
parameter as one global tensor in the layout of tensor-parallel size 1 (the TP shards side by
side along the split dimension: fused q/k/v groups in order, SwiGLU as [gate; up]), the decoder
layers stacked along a leading dimension indexed by the global layer number, under names that do
not depend on the layer spec (the norms before attention and MLP as Transformer Engine names
them). So the rules of convert.py for a tp 1, pp 1 model with te_names apply unchanged, through
`from_shards(rule, [tensor])`, to one layer's slice of a stacked tensor at a time.

The most held in memory is one output shard (~2 GiB) and one layer's tensor; the optimizer state
(about three quarters of the checkpoint) is never read. The model's shape comes from the run's
config.yaml and the tokenizer and special token ids from the tokenizer/ saved with the
checkpoint (controller/checkpoint.py), so the checkpoint directory is all the export needs.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from areal_hpc.config.load import load_config
from areal_hpc.config.schema import ExperimentConfig, ModelConfig
from areal_hpc.controller import checkpoint as ckpt
from areal_hpc.errors import UserError
from areal_hpc.trainer.convert import Rule, from_shards, hf_shapes, stage_rules
from areal_hpc.trainer.errors import WeightsError
from areal_hpc.trainer.hf_checkpoint import read_token_ids, write_index, write_model_files, write_tensors
from areal_hpc.trainer.hf_export import EXPORT_BUCKET_BYTES, plan_buckets
from areal_hpc.trainer.model import DTYPES

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_METADATA = ".metadata"


def checkpoint_key(megatron: str) -> tuple[str, int | None]:
    """Where a parameter of a tp 1, pp 1 model is in a torch_dist checkpoint: its key, and for a
    decoder layer's parameter its global layer number along the stacked leading dimension."""
    match = _LAYER.match(megatron)
    if match is None:
        return megatron, None
    return f"decoder.layers.{match.group(2)}", int(match.group(1))


class DistCheckpoint:
    """The model tensors of a torch_dist checkpoint, read one region at a time."""

    def __init__(self, path: Path):
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        class CachedReader(FileSystemReader):
            """Parses .metadata once: it lists every optimizer shard too (megabytes at 32B), and
            each region read would parse it again."""

            def read_metadata(self):
                if not hasattr(self, "_metadata"):
                    self._metadata = super().read_metadata()
                return self._metadata

        self.path = path
        self._reader = CachedReader(str(path))
        metadata = self._reader.read_metadata().state_dict_metadata
        self.tensors = {k: v for k, v in metadata.items() if isinstance(v, TensorStorageMetadata)}

    def _meta(self, key: str):
        if key not in self.tensors:
            raise WeightsError(f"{self.path}: no tensor {key} (not a checkpoint of this run's model)")
        return self.tensors[key]

    def shape(self, key: str, layer: int | None) -> tuple[int, ...]:
        """The shape of the tensor, or of one layer's slice of a stacked one."""
        size = tuple(self._meta(key).size)
        if layer is None:
            return size
        if layer >= size[0]:
            raise WeightsError(f"{self.path}: {key} stacks {size[0]} layers, the config has more")
        return size[1:]

    def dtype(self, key: str) -> torch.dtype:
        return self._meta(key).properties.dtype

    def get(self, key: str, layer: int | None) -> torch.Tensor:
        """The whole tensor, or layer `layer`'s slice, reading only its bytes."""
        import torch.distributed.checkpoint as dcp

        meta = self._meta(key)
        shape = self.shape(key, layer)
        out = torch.empty((1, *shape) if layer is not None else shape, dtype=meta.properties.dtype)
        offsets = [0] * len(meta.size)
        if layer is not None:
            offsets[0] = layer
        with warnings.catch_warnings():  # "assuming ... a single process": as intended
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load({key: out}, storage_reader=self._reader, planner=_region_planner(key, offsets), no_dist=True)
        return out[0] if layer is not None else out


def _region_planner(key: str, offsets: list[int]):
    """A load planner that reads the region of `key` at `offsets` the size of the destination
    (torch's default planner reads a plain tensor as the whole global tensor)."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
    from torch.distributed.checkpoint.planner import LoadPlan
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

    class RegionPlanner(DefaultLoadPlanner):
        def create_local_plan(self) -> LoadPlan:
            chunk = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=self.state_dict[key].size())
            return LoadPlan(create_read_items_for_chunk_list(key, self.metadata.state_dict_metadata[key], [chunk]))

        def lookup_tensor(self, index) -> torch.Tensor:
            return self.state_dict[index.fqn]

    return RegionPlanner(flatten_state_dict=False, flatten_sharded_tensors=False)


@dataclass(frozen=True)
class Item:
    """One exported parameter: where it is in the checkpoint and the HF tensors it becomes."""

    rule: Rule
    key: str
    layer: int | None
    hf_bytes: int


def plan(reader: DistCheckpoint, m: ModelConfig, dtype: torch.dtype) -> list[Item]:
    """Every exported parameter, checked against the shapes of `m` before any data is read."""
    want = hf_shapes(m)
    items = []
    for rule in stage_rules(m, 0, 1, te_names=True):
        if not rule.exported:
            continue
        key, layer = checkpoint_key(rule.megatron)
        meta = torch.empty(reader.shape(key, layer), dtype=dtype, device="meta")
        tensors = from_shards(rule, [meta], m)
        for name, t in zip(rule.hf, tensors, strict=True):
            if tuple(t.shape) != want[name]:
                raise WeightsError(f"{reader.path}: {key}{'' if layer is None else f'[{layer}]'} gives {name}"
                                   f" {list(t.shape)}, the config's shape has {list(want[name])}")
        items.append(Item(rule, key, layer, sum(t.numel() * t.element_size() for t in tensors)))
    return items


def run_config(ckpt_dir: Path) -> ExperimentConfig:
    """The resolved config saved with a complete, undamaged checkpoint (UserError otherwise)."""
    if not ckpt_dir.is_dir():
        raise UserError(f"{ckpt_dir}: no such checkpoint directory")
    if not ckpt.is_complete(ckpt_dir):
        raise UserError(f"{ckpt_dir}: not a complete checkpoint (no {ckpt.MARKER} file: not a step-N directory"
                        " of a run, or its job ended while writing it)")
    damaged = ckpt.problems(ckpt_dir)
    if damaged:
        raise UserError(f"{ckpt_dir}: damaged: " + "; ".join(damaged[:5]))
    if not (ckpt.trainer_dir(ckpt_dir) / _METADATA).is_file():
        raise UserError(f"{ckpt_dir}: no trainer checkpoint ({ckpt.trainer_dir(ckpt_dir) / _METADATA} is missing)")
    config = ckpt.config_file(ckpt_dir)
    if not config.is_file():
        raise UserError(f"{ckpt_dir}: no {config.name} (the run's config; checkpoints of older versions lack it)")
    # The saved shape is the model's; the directory the run started from may be gone.
    return load_config(config, ["model.path=null", "model.tokenizer_path=null"], check_files=False)


def export(ckpt_dir: str | Path, out_dir: str | Path, dtype: str | None = None, tokenizer: str | Path | None = None,
           shard_bytes: int = EXPORT_BUCKET_BYTES) -> Path:
    """Write checkpoint `ckpt_dir` as a Hugging Face directory `out_dir` (new or empty), in `dtype`
    (bf16, fp16 or fp32; default: the trained weights' own) with `tokenizer`'s tokenizer files
    (default: the checkpoint's copy)."""
    ckpt_dir, out = Path(ckpt_dir), Path(out_dir)
    if dtype is not None and dtype not in DTYPES:
        raise UserError(f"--dtype {dtype}: not one of {', '.join(DTYPES)}")
    cfg = run_config(ckpt_dir)
    saved_tokenizer = ckpt.tokenizer_dir(ckpt_dir)
    tokenizer_dir = Path(tokenizer) if tokenizer is not None else saved_tokenizer
    if not tokenizer_dir.is_dir():
        raise UserError(f"{ckpt_dir}: no tokenizer/ saved with it; pass --tokenizer DIR" if tokenizer is None
                        else f"--tokenizer {tokenizer}: no such directory")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out}: exists and is not an empty directory")
    reader = DistCheckpoint(ckpt.trainer_dir(ckpt_dir))
    m = cfg.model
    first_key, _ = checkpoint_key(stage_rules(m, 0, 1, te_names=True)[0].megatron)
    torch_dtype = DTYPES[dtype] if dtype is not None else reader.dtype(first_key)
    items = plan(reader, m, torch_dtype)
    buckets = plan_buckets([i.hf_bytes for i in items], shard_bytes)
    out.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    for k, bucket in enumerate(buckets):
        name = f"model-{k + 1:05d}-of-{len(buckets):05d}.safetensors"
        tensors: dict[str, torch.Tensor] = {}
        for item in (items[i] for i in bucket):
            full = from_shards(item.rule, [reader.get(item.key, item.layer)], m)
            tensors.update((n, t.to(torch_dtype)) for n, t in zip(item.rule.hf, full, strict=True))
        write_tensors(out, name, tensors)
        weight_map.update(dict.fromkeys(tensors, name))
    write_index(out, weight_map, sum(i.hf_bytes for i in items))
    ids_from = saved_tokenizer if saved_tokenizer.is_dir() else tokenizer_dir
    write_model_files(out, m, torch_dtype, read_token_ids(ids_from), tokenizer_dir)
    return out
