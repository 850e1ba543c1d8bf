"""Trainer ranks' Megatron shards at full size on the meta device, one process, no GPU.

torch's "fake" process-group backend stands in for the trainer world: megatron-core's
parallel_state sees the true world size and the rank's coordinates, and build_gpt (meta=True) then
builds exactly the shard that rank trains, with no parameter memory. Only the ranks whose shard can
differ are built: the leader (tp rank 0 of data-parallel replica 0) of the first stage, of one
middle stage and of the last. Middle stages name their layers alike (stage-local numbers), and the
tensor-parallel ranks of a stage hold shards of one shape, since config/validate.py refuses the
splits that would be uneven; `areal-hpc slurm verify` checks both claims against the mapping.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.trainer.model import build_gpt, params_dtype
from areal_hpc.trainer.parallel import RankInfo, rank_info


@dataclass(frozen=True)
class BuiltStage:
    """One built shard: the trainer-local rank and its coordinates as megatron-core reports them."""

    rank: int
    ranks: RankInfo
    # The stage's GPTModel, every parameter on the meta device.
    model: torch.nn.Module
    seconds: float

    @property
    def params(self) -> int:
        """Parameters this GPU holds (a tied output weight once, as the optimizer sees it)."""
        return sum(p.numel() for p in self.model.parameters())


def distinct_stages(pp: int) -> list[int]:
    """The pipeline stages whose shards can differ: first, one middle, last."""
    return sorted({0, min(1, pp - 1), pp - 1})


def stage_leader(cfg: ExperimentConfig, pp_rank: int) -> int:
    """Trainer-local rank of stage `pp_rank`'s leader (trainer/parallel.py's rank order)."""
    return pp_rank * cfg.trainer.tp * cfg.trainer.dp


class _OnMeta(TorchFunctionMode):
    """Every tensor megatron-core places explicitly goes to the meta device too: factories given
    device="cpu" (use_cpu_initialization) or a CUDA device (models/common/embeddings/
    rotary_pos_embedding.py), and the tied output weight's `.cuda()` on the last stage
    (models/common/language_module/language_module.py:244). Nothing allocates real memory."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if kwargs.get("device") is not None:
            kwargs = {**kwargs, "device": "meta"}
        return func(*args, **kwargs)


def build_stage(cfg: ExperimentConfig, device: str, pp_rank: int) -> BuiltStage:
    """The shard of stage `pp_rank`'s leader as a trainer on `device` ("cuda" or "cpu") builds it.

    Joins and leaves a fake process group of the trainer world; raises RuntimeError if this process
    already has a process group (a trainer's own)."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("build_stage needs a process without a torch.distributed process group")
    t = cfg.trainer
    rank = stage_leader(cfg, pp_rank)
    start = time.perf_counter()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=cfg.trainer_world)
    try:
        # No gloo groups: the fake backend has no transport to make them with.
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=t.tp, pipeline_model_parallel_size=t.pp, create_gloo_process_groups=False)
        with torch.device("meta"), _OnMeta():
            model = build_gpt(cfg, device, pp_rank == 0, pp_rank == t.pp - 1, meta=True)
            if device == "cuda":  # Transformer Engine's norms hold the training dtype, the local spec's fp32
                model = model.to(params_dtype(cfg, device))
        ranks = rank_info()
    finally:
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
    return BuiltStage(rank, ranks, model, time.perf_counter() - start)
