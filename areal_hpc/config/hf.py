"""The mapping between our ModelConfig and a Hugging Face Qwen2 `config.json`.

One place for it: the tiny-model builder, the trainer's export and the check of a user's
checkpoint against the config all use these two functions.
"""

from __future__ import annotations

import json
from pathlib import Path

from areal_hpc.config.schema import ModelConfig
from areal_hpc.errors import ConfigError

# ModelConfig field -> config.json key
_FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "num_query_groups": "num_key_value_heads",
    "max_position_embeddings": "max_position_embeddings",
    "rope_theta": "rope_theta",
    "rms_norm_eps": "rms_norm_eps",
    "tie_word_embeddings": "tie_word_embeddings",
}


def hf_config_dict(model: ModelConfig, torch_dtype: str = "float32", **token_ids: int) -> dict:
    """A Qwen2 config.json for `model`; token_ids may set bos_token_id / eos_token_id."""
    cfg = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "use_sliding_window": False,
        "max_window_layers": model.num_layers,
        "torch_dtype": torch_dtype,
    }
    for ours, theirs in _FIELDS.items():
        cfg[theirs] = getattr(model, ours)
    cfg.update(token_ids)
    return cfg


def read_hf_config(path: str | Path) -> dict:
    file = Path(path) / "config.json"
    try:
        return json.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{file}: not found (not a Hugging Face model directory)") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{file}: not valid JSON: {e}") from None


def shape_mismatches(model: ModelConfig, hf: dict) -> list[str]:
    """Fields where the config and a checkpoint's config.json disagree, one line each."""
    problems = []
    for ours, theirs in _FIELDS.items():
        if theirs == "rope_theta" and theirs not in hf:  # newer configs nest it in rope_parameters
            value = (hf.get("rope_parameters") or {}).get("rope_theta")
        else:
            value = hf.get(theirs)
        if theirs == "tie_word_embeddings" and value is None:
            value = False
        if value is None or value != getattr(model, ours):
            problems.append(f"model.{ours} = {getattr(model, ours)!r} but config.json has {theirs} = {value!r}")
    return problems
