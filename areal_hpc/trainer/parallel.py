"""The trainer ranks' torch.distributed world and Megatron's tensor/pipeline/data-parallel groups.

Rank order is megatron-core's default ("tp-cp-ep-dp-pp"): tensor-parallel ranks are adjacent, then
data-parallel replicas, then pipeline stages, so trainer-local rank
r = tp_rank + tp * (dp_rank + dp * pp_rank). The leader of pipeline stage s (tp_rank 0 of
data-parallel replica 0) is rank s * tp * dp.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.config.validate import trainer_layout_problems
from areal_hpc.trainer import cpu_compat
from areal_hpc.trainer.errors import ParallelConfigError
from areal_hpc.wire.device import device_of
from areal_hpc.wire.layout import trainer_cuda_device


def parallel_problems(cfg: ExperimentConfig, world_size: int) -> list[str]:
    """Why the trainer layout cannot run, one line each; empty when it can."""
    t = cfg.trainer
    if min(t.tp, t.pp, t.dp) < 1:
        return [f"trainer.tp/pp/dp = {t.tp}/{t.pp}/{t.dp}: each must be >= 1"]
    problems = []
    if t.tp * t.pp * t.dp != world_size:
        problems.append(
            f"trainer.tp * trainer.pp * trainer.dp = {t.tp}*{t.pp}*{t.dp} = {t.tp * t.pp * t.dp}"
            f" but the trainer world has {world_size} ranks"
        )
    return problems + trainer_layout_problems(cfg)


def check_parallel(cfg: ExperimentConfig, world_size: int) -> None:
    problems = parallel_problems(cfg, world_size)
    if problems:
        raise ParallelConfigError("; ".join(problems))


def init_trainer_world(cfg: ExperimentConfig, rank: int, world_size: int, init_method: str) -> None:
    """Join the trainer ranks' process group and build Megatron's parallel groups.

    `rank` and `world_size` are trainer-local (the caller derives them from the MPI world);
    `init_method` is a torch.distributed URL such as "tcp://host:port" or "env://" (torchrun).
    gloo on CPU, NCCL on GPU (on the rank's GPU of the plan: wire/layout.py trainer_cuda_device).
    Idempotent for the process group; raises ParallelConfigError for a layout the model cannot use
    (and ConfigError for `device: cuda` without a visible GPU).
    """
    check_parallel(cfg, world_size)
    device = device_of(cfg)
    from megatron.core import parallel_state, tensor_parallel

    if device == "cpu":
        cpu_compat.apply()
    else:
        torch.cuda.set_device(trainer_cuda_device(cfg, rank, torch.cuda.device_count()))
    if not dist.is_initialized():
        dist.init_process_group(
            "gloo" if device == "cpu" else "nccl", init_method=init_method, rank=rank,
            world_size=world_size, timeout=datetime.timedelta(minutes=30),
        )
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=cfg.trainer.tp, pipeline_model_parallel_size=cfg.trainer.pp
    )
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    if device == "cpu":
        cpu_compat.seed(cfg.seed, tp_rank)
    else:
        torch.manual_seed(cfg.seed)
        tensor_parallel.model_parallel_cuda_manual_seed(cfg.seed)


def leave_trainer_world() -> None:
    """Leave the trainer process group together, at a clean end only.

    Rank 0 of the group hosts the TCP store the init_method names: a rank that outlives it while
    its gloo threads still talk to the store dies in std::terminate at exit. A barrier first
    means no rank leaves while another still needs the store (one small all-reduce, at the end).
    """
    from megatron.core import parallel_state

    if not dist.is_initialized():
        return
    dist.barrier()
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


@dataclass(frozen=True)
class RankInfo:
    """Where this rank sits in the trainer layout (after init_trainer_world)."""

    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    dp_rank: int
    dp_size: int

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def stage_leader(self) -> bool:
        return self.tp_rank == 0 and self.dp_rank == 0


def rank_info() -> RankInfo:
    from megatron.core import parallel_state as ps

    return RankInfo(
        ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size(),
        ps.get_pipeline_model_parallel_rank(), ps.get_pipeline_model_parallel_world_size(),
        ps.get_data_parallel_rank(), ps.get_data_parallel_world_size(),
    )
