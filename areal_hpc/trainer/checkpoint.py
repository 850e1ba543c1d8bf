"""Megatron distributed checkpoints of the trainer: model, optimizer, scheduler and counters.

Every trainer rank writes its own shards (megatron-core's dist_checkpointing, PyTorch distributed
checkpoint format); the scheduler state and the step counters are common state written once.
Loading builds the same sharded layout, so resuming is exact: the next steps' losses equal those of
a run that never stopped.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from areal_hpc.trainer import cpu_compat
from areal_hpc.trainer.errors import WeightsError

# The distributed optimizer's state layout: per data-parallel group, reshardable across a change of
# the data-parallel size (megatron's default; "fully_sharded_model_space" fails validation in 0.16.1).
_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}


def _sharded_state(ddp, optimizer, is_loading: bool) -> dict:
    model_state = ddp.module.sharded_state_dict()
    optim_state = optimizer.sharded_state_dict(model_state, is_loading=is_loading, metadata=_METADATA)
    return {"model": model_state, "optimizer": optim_state}


def save(path: Path, ddp, optimizer, scheduler, counters: dict[str, int]) -> None:
    from megatron.core import dist_checkpointing

    if dist.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    with cpu_compat.cuda_as_cpu():
        state = _sharded_state(ddp, optimizer, is_loading=False)
        state["scheduler"] = scheduler.state_dict()
        state["counters"] = dict(counters)
        dist_checkpointing.save(state, str(path))
    dist.barrier()


def load(path: Path, ddp, optimizer, scheduler) -> dict[str, int]:
    """Restore into the built model and optimizer; returns the saved counters."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.core import CheckpointingException
    from torch.distributed.checkpoint.api import CheckpointException

    if not (path / "metadata.json").is_file():
        raise WeightsError(f"{path}: not a trainer checkpoint (no metadata.json)")
    cpu_compat.prime_optimizer_state(optimizer)
    # Loading copies into views of the parameters (the distributed optimizer's fp32 shards).
    with torch.no_grad(), cpu_compat.cuda_as_cpu():
        template = _sharded_state(ddp, optimizer, is_loading=True)
        try:
            state = dist_checkpointing.load(template, str(path))
        except CheckpointingException as e:
            raise WeightsError(f"{path}: {e}") from None
        except CheckpointException as e:  # a BaseException: PyTorch's per-rank failures
            reasons = sorted({str(exc) for exc, _ in e.failures.values()})
            raise WeightsError(f"{path}: " + "; ".join(reasons)) from None
        ddp.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    cpu_compat.restore_adam_steps(optimizer)
    scheduler.load_state_dict(state["scheduler"])
    return state["counters"]
