"""The GPU profile (run on a machine with an NVIDIA GPU and Transformer Engine): the TE layer spec
computes the same log-probs as Hugging Face, exports the checkpoint it loaded, and trains."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file
from trainer_worker import trajectories

pytestmark = [pytest.mark.cuda, pytest.mark.slow]


def hf_logprobs(model_dir, trajectories) -> list[list[float]]:
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for t in trajectories:
            logp = model(torch.tensor([t.prompt_ids + t.output_ids])).logits[0].log_softmax(-1)
            p = len(t.prompt_ids)
            out.append([logp[p - 1 + i, tok].item() for i, tok in enumerate(t.output_ids)])
    return out


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
