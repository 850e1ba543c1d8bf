"""The mapping between our ModelConfig and a Hugging Face `config.json`, per model family.

One place for it: filling the shape from a checkpoint (config/load.py), the tiny-model builder,
the trainer's export and the check of a checkpoint against the config all use these functions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_hpc.config.schema import ModelConfig
from areal_hpc.errors import ConfigError


@dataclass(frozen=True)
class Family:
    """What a family fixes about the architecture."""

    architecture: str
    qkv_bias: bool
    qk_norm: bool


FAMILIES = {
    "qwen2": Family("Qwen2ForCausalLM", qkv_bias=True, qk_norm=False),
    "qwen3": Family("Qwen3ForCausalLM", qkv_bias=False, qk_norm=True),
    "llama": Family("LlamaForCausalLM", qkv_bias=False, qk_norm=False),
}
SUPPORTED = ", ".join(f"{f.architecture} ({name})" for name, f in FAMILIES.items())

# ModelConfig field -> config.json key, for the fields every family writes alike.
_FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "num_query_groups": "num_key_value_heads",
    "max_position_embeddings": "max_position_embeddings",
    "rms_norm_eps": "rms_norm_eps",
    "tie_word_embeddings": "tie_word_embeddings",
}
# Every field a checkpoint's config.json decides (config/load.py fills them).
SHAPE_FIELDS = ("family", *_FIELDS, "head_dim", "rope_theta", "qkv_bias", "qk_norm", "rope_scaling")
# config.json keys of SHAPE_FIELDS that are not in _FIELDS (for messages).
_KEYS = {"family": "model_type", "head_dim": "head_dim", "rope_theta": "rope_theta",
         "qkv_bias": "model_type", "qk_norm": "model_type", "rope_scaling": "rope_scaling"}
# What transformers assumes when a config.json leaves a key out.
_HF_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False}

# Llama 3 RoPE scaling: megatron-core 0.16.1's RotaryEmbedding takes only the factor and fixes the
# rest (models/common/embeddings/rotary_pos_embedding.py, _apply_scaling's defaults).
LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def read_hf_config(path: str | Path) -> dict:
    file = Path(path) / "config.json"
    try:
        return json.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{file}: not found (not a Hugging Face model directory)") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{file}: not valid JSON: {e}") from None


def family_of(hf: dict, file: str | Path) -> str:
    """The family of a config.json, from "architectures" (or "model_type" when it has none)."""
    archs = hf.get("architectures") or []
    for name, family in FAMILIES.items():
        if family.architecture in archs:
            return name
    if not archs and hf.get("model_type") in FAMILIES:
        return hf["model_type"]
    named = ", ".join(archs) if archs else f"model_type {hf.get('model_type')!r}"
    raise ConfigError(f"{file}: architecture {named} is not supported; supported: {SUPPORTED}")


def _rope(hf: dict) -> tuple[float, dict | None]:
    """rope_theta and the scaling, from the flat keys of older configs or `rope_parameters`."""
    params = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
    theta = float(hf.get("rope_theta", params.pop("rope_theta", 10000.0)))  # transformers' default
    kind = params.pop("rope_type", params.pop("type", "default"))
    return theta, (None if kind == "default" and not params else {"rope_type": kind, **params})


def _refusals(hf: dict, family: str) -> list[str]:
    """config.json settings of a supported family that our Megatron model cannot represent."""
    refused = []
    if hf.get("hidden_act", "silu") != "silu":
        refused.append(f"hidden_act = {hf['hidden_act']!r} (only silu)")
    if hf.get("use_sliding_window"):
        refused.append("use_sliding_window = true (sliding-window attention)")
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        refused.append(f"partial_rotary_factor = {hf['partial_rotary_factor']} (only 1.0)")
    if family != "qwen2" and hf.get("attention_bias"):
        refused.append("attention_bias = true (a bias on o_proj too)")
    if hf.get("mlp_bias"):
        refused.append("mlp_bias = true")
    return refused


def shape_from_hf(hf: dict, file: str | Path) -> dict[str, Any]:
    """The value of every SHAPE_FIELDS field a config.json gives (head_dim None if it has none).

    Raises ConfigError naming `file` for an unsupported architecture, a setting the model cannot
    represent, or a missing key."""
    family = family_of(hf, file)
    refused = _refusals(hf, family)
    if refused:
        raise ConfigError(f"{file}: not supported for {FAMILIES[family].architecture}: " + "; ".join(refused))
    shape: dict[str, Any] = {"family": family}
    for ours, theirs in _FIELDS.items():
        shape[ours] = hf.get(theirs, _HF_DEFAULTS.get(ours))
    if shape["num_query_groups"] is None:  # transformers: no key/value heads given means no grouping
        shape["num_query_groups"] = shape["num_attention_heads"]
    missing = [_FIELDS[f] for f, v in shape.items() if v is None]
    if missing:
        raise ConfigError(f"{file}: has no {', '.join(missing)}")
    shape["rms_norm_eps"] = float(shape["rms_norm_eps"])
    shape["head_dim"] = hf.get("head_dim")
    shape["rope_theta"], shape["rope_scaling"] = _rope(hf)
    shape["qkv_bias"] = FAMILIES[family].qkv_bias
    shape["qk_norm"] = FAMILIES[family].qk_norm
    return shape


def disagreements(model: ModelConfig, shape: dict[str, Any], only_set: bool) -> list[tuple[str, Any, Any]]:
    """(field, ours, theirs) where `model` and a checkpoint's shape differ; `only_set`: skip
    fields `model` leaves null (config/load.py fills those). head_dim compares as the head size
    it stands for."""
    out = []
    for field in SHAPE_FIELDS:
        ours, theirs = getattr(model, field), shape[field]
        if only_set and ours is None:
            continue
        if field == "head_dim":
            same = model.head_size == (theirs or shape["hidden_size"] // shape["num_attention_heads"])
        else:
            same = ours == theirs
        if not same:
            out.append((field, ours, theirs))
    return out


def config_key(field: str) -> str:
    """The config.json key a ModelConfig shape field comes from (for messages)."""
    return _FIELDS.get(field) or _KEYS[field]


def shape_mismatches(model: ModelConfig, hf: dict, file: str | Path = "config.json") -> list[str]:
    """Fields where the config and a checkpoint's config.json disagree, one line each."""
    return [f"model.{field} = {ours!r} but {file} has {config_key(field)} = {theirs!r}"
            for field, ours, theirs in disagreements(model, shape_from_hf(hf, file), only_set=False)]


def hf_config_dict(model: ModelConfig, torch_dtype: str = "float32", **token_ids: int) -> dict:
    """The family's config.json for `model`; token_ids may set bos_token_id / eos_token_id."""
    family = FAMILIES[model.family]
    cfg: dict[str, Any] = {
        "architectures": [family.architecture],
        "model_type": model.family,
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": torch_dtype,
    }
    if model.family in ("qwen2", "qwen3"):
        cfg.update(use_sliding_window=False, max_window_layers=model.num_layers)
    if model.family in ("qwen3", "llama"):
        cfg.update(attention_bias=False, head_dim=model.head_size)
    if model.family == "llama":
        cfg["mlp_bias"] = False
    for ours, theirs in _FIELDS.items():
        cfg[theirs] = getattr(model, ours)
    cfg["rope_theta"] = model.rope_theta
    if model.rope_scaling is not None:
        cfg["rope_scaling"] = dict(model.rope_scaling)
    cfg.update(token_ids)
    return cfg
