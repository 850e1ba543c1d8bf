"""The compute device of this process: the config's `device` with "auto" resolved, in one place.

Every device decision of a rank (Megatron on CPU or CUDA, gloo or NCCL, vLLM's profile, the CPU
compatibility layer, the benchmarks' GPU parts) keys on `device_of(cfg)`, never on
`torch.cuda.is_available()` directly, so `device: cpu` on a machine with a GPU stays on the CPU.
Whether CUDA is visible is asked once per process, and only after a generator rank has narrowed
CUDA_VISIBLE_DEVICES to its GPUs (runtime/generator_rank.py): where NVML cannot count the
devices, asking initialises CUDA, which reads that variable once.
"""

from __future__ import annotations

import functools
import os

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.errors import ConfigError


@functools.cache
def cuda_visible() -> bool:
    """Whether this process sees a CUDA device (asked once).

    torch counts the devices through NVML where it can, which honours CUDA_VISIBLE_DEVICES and,
    unlike torch.cuda.is_available(), initialises no CUDA driver in this process: a generator
    rank may still narrow CUDA_VISIBLE_DEVICES for vLLM's engine afterwards."""
    import torch

    return torch.cuda.device_count() > 0


def resolve(requested: str, cuda: bool) -> str:
    """'cpu' or 'cuda' for a config's `device`, given whether CUDA is visible; a 'cuda' request
    without a visible device is the user's error."""
    if requested == "auto":
        return "cuda" if cuda else "cpu"
    if requested == "cuda" and not cuda:
        seen = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={seen!r})" if seen is not None else ""
        raise ConfigError(f"device = 'cuda' but no CUDA device is visible to this rank{where}")
    return requested


def device_of(cfg: ExperimentConfig) -> str:
    """The device this process computes on for `cfg`: 'cpu' or 'cuda'."""
    return resolve(cfg.device, cuda_visible() if cfg.device != "cpu" else False)
