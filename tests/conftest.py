"""Shared pytest setup: the `cuda` marker skips with a printed reason on machines without a GPU."""

from __future__ import annotations

import os
from pathlib import Path

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


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """The tiny Qwen2 of the CPU profile (random weights, trained tokenizer) as a HF directory."""
    from areal_hpc.config.load import load_config
    from areal_hpc.data.tiny_model import build_tiny_model

    cfg = load_config("configs/experiments/tiny-cpu.yaml")
    return build_tiny_model(cfg.model, tmp_path_factory.mktemp("tiny-qwen2"), seed=0)


@pytest.fixture(autouse=True, scope="session")
def _repo_root_cwd():
    """Tests refer to configs/ and friends relative to the repository root."""
    os.chdir(Path(__file__).resolve().parent.parent)
