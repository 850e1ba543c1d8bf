"""One trainer rank against Hugging Face: logits, packing, export/import, bad checkpoints."""

from __future__ import annotations

import pytest
import torch
from trainer_worker import trajectories

from areal_hpc.config.hf import read_hf_config, shape_mismatches
from areal_hpc.config.load import load_config
from areal_hpc.trainer.hf_checkpoint import HFCheckpoint

pytestmark = pytest.mark.slow


def hf_logits(model_dir, ids: torch.Tensor) -> torch.Tensor:
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids).logits[0]


def export_tensors(path) -> dict[str, torch.Tensor]:
    ckpt = HFCheckpoint(path)
    return {name: ckpt.get(name) for name in ckpt.names()}


def test_megatron_logits_equal_transformers(single_run, tiny_model_dir):
    ref = hf_logits(tiny_model_dir, single_run["logits_ids"])
    assert (single_run["logits"] - ref).abs().max().item() < 1e-4


def hf_logprobs(model_dir, trajectories) -> list[list[float]]:
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for t in trajectories:
            logp = model(torch.tensor([t.prompt_ids.tolist() + t.output_ids.tolist()])).logits[0].log_softmax(-1)
            p = len(t.prompt_ids)
            out.append([logp[p - 1 + i, tok].item() for i, tok in enumerate(t.output_ids)])
    return out


@pytest.mark.parametrize("tied", [False, True])
def test_packed_log_probs_equal_transformers(single_run, tiny_model_dir, tied_model_dir, tied):
    got = (single_run["tied"] if tied else single_run)["logprobs"]
    ref = hf_logprobs(tied_model_dir if tied else tiny_model_dir, trajectories())
    assert max(abs(a - b) for x, y in zip(got, ref, strict=True) for a, b in zip(x, y, strict=True)) < 1e-4


def test_packed_thd_equals_padded(single_run):
    packed, padded = single_run["packed"], single_run["padded"]
    assert [len(p) for p in packed] == [len(p) for p in padded]
    assert max(abs(a - b) for x, y in zip(packed, padded, strict=True) for a, b in zip(x, y, strict=True)) < 1e-5


def test_export_then_import_round_trips_bit_identically(single_run, trainer_out):
    a, b = export_tensors(trainer_out / "export-a"), export_tensors(trainer_out / "export-b")
    trained = single_run["trained"]
    assert sorted(a) == sorted(trained) == sorted(b)
    for name, tensor in trained.items():
        assert torch.equal(a[name], tensor), name
        assert torch.equal(b[name], tensor), name


def test_exported_directory_is_a_working_hugging_face_model(single_run, trainer_out, tiny_model_dir):
    export = trainer_out / "export-a"
    cfg = load_config("configs/experiments/tiny-cpu.yaml")
    assert shape_mismatches(cfg.model, read_hf_config(export)) == []
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (export / name).read_bytes() == (tiny_model_dir / name).read_bytes()
    ref = hf_logits(export, single_run["logits_ids"])
    assert (single_run["trained_logits"] - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("case, message", [
    ("missing", "missing tensors: model.layers.1.mlp.up_proj.weight"),
    ("misshaped", "wrong shapes: model.layers.2.self_attn.k_proj.weight [32, 128] (expected [64, 128])"),
    ("unexpected", "unexpected tensors: model.layers.9.mlp.gate_proj.weight"),
    ("too_long", "trajectory (prompt_id 0, sample 0): "),
    ("ragged", "output tokens but "),
])
def test_bad_input_fails_with_a_message_naming_it(single_run, case, message):
    error = single_run["errors"][case]
    kind = "BatchError" if case in ("too_long", "ragged") else "WeightsError"
    assert error.startswith(kind + ":") and message in error, error
