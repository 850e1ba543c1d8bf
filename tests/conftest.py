"""Shared pytest setup: the `cuda` marker skips with a printed reason on machines without a GPU."""

from __future__ import annotations

import os

import pytest

# One thread per process: tests start several ranks on a 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (cuda marker); this machine has none")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
