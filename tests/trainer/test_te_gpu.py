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
    assert cuda_run["dtype"] == "torch.bfloat16", "params_dtype auto is bf16 on CUDA"
    assert "no fp32 attention kernel for packed (THD) micro-batches" in cuda_run["fp32_refused"]
    ref = hf_logprobs(tiny_model_dir, trajectories())  # fp32
    diffs = [abs(a - b) for x, y in zip(cuda_run["packed"], ref, strict=True) for a, b in zip(x, y, strict=True)]
    assert sum(diffs) / len(diffs) < 0.02 and max(diffs) < 0.2  # bf16 weights and activations
    original = load_file(str(tiny_model_dir / "model.safetensors"))
    for name, tensor in original.items():
        assert torch.equal(cuda_run["exported"][name].cpu(), tensor.to(torch.bfloat16)), name
    for key in ("step", "fp16_step"):
        assert math.isfinite(cuda_run[key]["loss"]) and cuda_run[key]["version"] == 1.0
