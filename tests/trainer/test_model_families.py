"""Every supported family (Qwen2, Qwen3, Llama) end to end: the shape read from config.json, the
trainer against transformers at tp 1, tp 2 and pp 2, the export from shards, vLLM serving the
export with the trainer's log-probs, and clear refusals of what the trainer cannot represent.

The multi-rank parts share one 2-rank launch (the `families` scenario of trainer_worker.py)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from trainer_worker import FAMILY_LOGITS_IDS, FAMILY_SHAPES, family_config, trajectories

from areal_hpc.config.hf import read_hf_config, shape_from_hf
from areal_hpc.config.load import load_config
from areal_hpc.errors import ConfigError
from areal_hpc.trainer.errors import WeightsError
from areal_hpc.trainer.hf_checkpoint import HFCheckpoint

FAMILIES = tuple(FAMILY_SHAPES)
LAYOUTS = ("tp1", "tp2", "pp2")
slow = pytest.mark.slow


def hf_model(model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


def hf_logprobs(model_dir: Path, trajs) -> list[list[float]]:
    model, out = hf_model(model_dir), []
    with torch.no_grad():
        for t in trajs:
            ids = t.prompt_ids.tolist() + t.output_ids.tolist()
            logp = model(torch.tensor([ids])).logits[0].log_softmax(-1)
            p = len(t.prompt_ids)
            out.append([logp[p - 1 + i, tok].item() for i, tok in enumerate(t.output_ids)])
    return out


def max_gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for u, v in zip(a, b, strict=True) for x, y in zip(u, v, strict=True))


def merged(runs: list[dict], key: tuple[str, str], what: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for run in runs:
        out.update(run[key][what])
    return out


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b)
    return max((a[k] - b[k]).abs().max().item() for k in a)


def edited_copy(src: Path, dst: Path, config: dict | None = None, drop: str | None = None) -> Path:
    """`src` with config.json keys replaced and one tensor removed."""
    shutil.copytree(src, dst)
    if config:
        (dst / "config.json").write_text(json.dumps({**read_hf_config(src), **config}))
    if drop:
        tensors = load_file(str(src / "model.safetensors"))
        del tensors[drop]
        save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


# ------------------------------------------------------------------ the shape from config.json


@pytest.mark.parametrize("family", FAMILIES)
def test_the_shape_comes_from_config_json(family_model_dirs, tmp_path, family):
    m = family_config(tmp_path, family_model_dirs[family], 1, 1, 1).model
    built = load_config("configs/experiments/tiny-cpu.yaml", [
        "model.hidden_size=64", "model.intermediate_size=128", "model.num_layers=2", *FAMILY_SHAPES[family]]).model
    for field in ("family", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_attention_heads",
                  "num_query_groups", "max_position_embeddings", "rope_theta", "rms_norm_eps",
                  "tie_word_embeddings", "qkv_bias", "qk_norm", "rope_scaling"):
        assert getattr(m, field) == getattr(built, field), field
    assert m.head_size == built.head_size == 32
    assert (m.qkv_bias, m.qk_norm) == {"qwen2": (True, False), "qwen3": (False, True), "llama": (False, False)}[family]


def test_a_yaml_field_may_repeat_config_json_but_not_contradict_it(family_model_dirs):
    qwen3 = family_model_dirs["qwen3"]
    cfg = load_config("configs/experiments/tiny-cpu.yaml", [f"model.path={qwen3}", "model.family=qwen3",
                      "model.head_dim=32", "model.hidden_size=64", "model.intermediate_size=128",
                      "model.num_layers=2", "model.num_attention_heads=4"])
    assert cfg.model.qk_norm and cfg.model.head_dim == 32
    with pytest.raises(ConfigError) as info:
        load_config("configs/experiments/tiny-cpu.yaml", [f"model.path={qwen3}"])  # tiny-qwen2.yaml's shape
    message = str(info.value)
    assert f"model.hidden_size = 128 disagrees with {qwen3}/config.json: hidden_size = 64" in message
    assert "model.family = 'qwen2' disagrees" in message and "model_type = 'qwen3'" in message


# config.json files as published (the keys that matter), in the older flat RoPE layout.
PUBLISHED = {
    "DeepSeek-R1-Distill-Qwen-1.5B": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960,
        "max_position_embeddings": 131072, "num_attention_heads": 12, "num_hidden_layers": 28,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 10000, "sliding_window": 4096,
        "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936},
    "Qwen3-0.6B": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False, "head_dim": 128,
        "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
        "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000, "tie_word_embeddings": True, "vocab_size": 151936},
    "Llama-3.1-8B": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "head_dim": 128,
        "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False,
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256},
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_configs_load(tmp_path, name):
    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED[name]))
    m = load_config(None, [f"model.path={tmp_path}", "device=cpu"]).model
    want = {"DeepSeek-R1-Distill-Qwen-1.5B": ("qwen2", 128, True, False, None),
            "Qwen3-0.6B": ("qwen3", 128, False, True, None),
            "Llama-3.1-8B": ("llama", 128, False, False, 8.0)}[name]
    assert (m.family, m.head_size, m.qkv_bias, m.qk_norm, (m.rope_scaling or {}).get("factor")) == want
    assert m.hidden_size == PUBLISHED[name]["hidden_size"] and m.rope_theta == PUBLISHED[name]["rope_theta"]


def test_without_a_path_the_shape_must_be_written(tmp_path):
    (tmp_path / "c.yaml").write_text("model: {name: mine}\n")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "c.yaml")
    assert "model.vocab_size: must be set" in str(info.value) and "model.family: must be set" in str(info.value)


@pytest.mark.parametrize("edit, named", [
    ({"architectures": ["MistralForCausalLM"], "model_type": "mistral"},
     "architecture MistralForCausalLM is not supported; supported: Qwen2ForCausalLM (qwen2),"
     " Qwen3ForCausalLM (qwen3), LlamaForCausalLM (llama)"),
    ({"attention_bias": True}, "not supported for LlamaForCausalLM: attention_bias = true"),
    ({"rope_scaling": None, "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 5e5}},
     "rope_type 'yarn' is not supported (only llama3)"),
    ({"rope_scaling": None, "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 4096,
                                                "rope_theta": 5e5}},
     "applies llama3 scaling only with low_freq_factor 1.0, high_freq_factor 4.0,"
     " original_max_position_embeddings 8192"),
])
def test_what_the_trainer_cannot_represent_is_refused_at_load(family_model_dirs, tmp_path, edit, named):
    bad = edited_copy(family_model_dirs["llama"], tmp_path / "bad", config=edit)
    with pytest.raises(ConfigError) as info:
        family_config(tmp_path, bad, 1, 1, 1)
    assert named in str(info.value) and str(bad) in str(info.value), str(info.value)


@pytest.mark.parametrize("family, config, drop, named", [
    ("qwen3", None, "model.layers.1.self_attn.k_norm.weight", "missing tensors: model.layers.1.self_attn.k_norm.weight"),
    ("llama", {"intermediate_size": 256}, None,
     "wrong shapes: model.layers.0.mlp.down_proj.weight [64, 128] (expected [64, 256])"),
    ("qwen2", {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, None,
     "unexpected tensors: model.layers.0.self_attn.k_proj.bias"),
])
def test_weights_that_disagree_with_config_json_are_named(family_model_dirs, tmp_path, family, config, drop, named):
    bad = edited_copy(family_model_dirs[family], tmp_path / "bad", config=config, drop=drop)
    with pytest.raises(WeightsError) as info:
        HFCheckpoint(bad).check(family_config(tmp_path, bad, 1, 1, 1).model)
    assert str(info.value).startswith(f"{bad}: ") and named in str(info.value), str(info.value)


# ------------------------------------------------------------------ the trainer at tp 1, tp 2, pp 2


@slow
@pytest.mark.parametrize("family", FAMILIES)
def test_log_probs_equal_transformers_in_every_layout(families_run, family_model_dirs, family):
    ref = hf_logprobs(family_model_dirs[family], trajectories())
    for layout in LAYOUTS:
        for run in families_run:
            assert max_gap(run[family, layout]["logprobs"], ref) < 1e-4, layout


@slow
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers(families_run, family_model_dirs, family):
    run = families_run[0]
    with torch.no_grad():
        ref = hf_model(family_model_dirs[family])(run["ids"]).logits[0]
    assert (run[family, "tp1"]["logits"] - ref).abs().max().item() < 1e-4


def test_the_logits_check_sees_llama3_scaling(family_model_dirs, tmp_path):
    """Without its RoPE scaling the tiny Llama's logits move far more than test_logits' tolerance."""
    source = family_model_dirs["llama"]
    theta = read_hf_config(source)["rope_parameters"]["rope_theta"]
    plain = edited_copy(source, tmp_path / "plain", config={"rope_parameters": {"rope_type": "default",
                                                                                "rope_theta": theta}})
    with torch.no_grad():
        gap = (hf_model(source)(FAMILY_LOGITS_IDS).logits - hf_model(plain)(FAMILY_LOGITS_IDS).logits).abs().max()
    assert gap.item() > 1e-3


@slow
@pytest.mark.parametrize("family", FAMILIES)
def test_layouts_agree_on_loss_gradients_and_the_step(families_run, family):
    tp2, pp2 = merged(families_run, (family, "tp2"), "grads"), merged(families_run, (family, "pp2"), "grads")
    assert any("_norm." in n for n in tp2) == (family == "qwen3")  # the q/k norms train too
    scale = max(g.abs().max().item() for g in tp2.values())
    assert max_diff(tp2, pp2) < 1e-6 * max(scale, 1.0)
    assert families_run[0][family, "tp2"]["loss"] == pytest.approx(families_run[0][family, "pp2"]["loss"], rel=1e-6)
    step = merged(families_run, (family, "tp1"), "after_step")
    for layout in ("tp2", "pp2"):
        assert max_diff(merged(families_run, (family, layout), "after_step"), step) < 1e-5, layout


@slow
@pytest.mark.parametrize("layout", ("tp2", "pp2"))
@pytest.mark.parametrize("family", FAMILIES)
def test_export_from_shards_is_the_checkpoint(families_run, trainer_out, family_model_dirs, family, layout):
    export, source = trainer_out / f"export-{family}-{layout}", family_model_dirs[family]
    ckpt = HFCheckpoint(export)
    original = load_file(str(source / "model.safetensors"))
    assert ckpt.names() == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(ckpt.get(name), tensor), name
    assert shape_from_hf(read_hf_config(export), export) == shape_from_hf(read_hf_config(source), source)


# ------------------------------------------------------------------ vLLM serves each export


@slow
def test_vllm_serves_each_export_with_the_trainers_log_probs(families_run, trainer_out, tmp_path):
    from areal_hpc.rollout.generator import Generator

    trajs = trajectories()
    sequences = [(t.prompt_ids.tolist(), t.output_ids.tolist()) for t in trajs]

    async def served(model_dir: Path) -> list[list[float]]:
        gen = Generator(family_config(tmp_path, model_dir, 1, 1, 1), model_dir)
        try:
            await gen.start()
            return await gen.recompute_logprobs(sequences)
        finally:
            await gen.shutdown()

    for family in FAMILIES:
        got = asyncio.run(served(trainer_out / f"export-{family}-tp2"))
        assert max_gap(got, families_run[0][family, "tp1"]["logprobs"]) < 1e-4, family
