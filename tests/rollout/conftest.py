"""Rollout fixtures: a second tiny model that differs from `tiny_model_dir` in its weights only."""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir_b(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory):
    """Same config and tokenizer as `tiny_model_dir`, other random weights (seed 1)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = tmp_path_factory.mktemp("tiny-qwen2-b")
    shutil.copytree(tiny_model_dir, out, dirs_exist_ok=True)
    torch.manual_seed(1)
    model = Qwen2ForCausalLM(Qwen2Config.from_pretrained(str(out))).to(torch.float32)
    model.save_pretrained(str(out), safe_serialization=True)
    return out
