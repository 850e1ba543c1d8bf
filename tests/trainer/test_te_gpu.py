"""The GPU profile (run on a machine with an NVIDIA GPU and Transformer Engine): the TE layer spec
computes the same log-probs as Hugging Face, exports the checkpoint it loaded, and trains."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file
from test_hf_parity import hf_logprobs
from trainer_worker import trajectories

pytestmark = [pytest.mark.cuda, pytest.mark.slow]


def test_te_spec_matches_hugging_face_and_trains(cuda_run, tiny_model_dir):
    assert cuda_run["te_rules"], "the TE spec fuses the norms into the linears"
    ref = hf_logprobs(tiny_model_dir, trajectories())
    diff = max(abs(a - b) for x, y in zip(cuda_run["packed"], ref, strict=True) for a, b in zip(x, y, strict=True))
    assert diff < 1e-3
    original = load_file(str(tiny_model_dir / "model.safetensors"))
    for name, tensor in original.items():
        assert torch.equal(cuda_run["exported"][name].cpu(), tensor), name
    for key in ("step", "bf16_step"):
        assert math.isfinite(cuda_run[key]["loss"]) and cuda_run[key]["version"] == 1.0
