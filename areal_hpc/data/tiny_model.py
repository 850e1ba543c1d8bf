"""Build a tiny model of the CPU profile as a Hugging Face directory (random weights), of any
supported family (config/hf.py FAMILIES); the CPU profile's own is a Qwen2.

The directory is what a real checkpoint looks like (config.json, model.safetensors, tokenizer
files), so the trainer's converter and vLLM load it through their real loading code.
"""

from __future__ import annotations

from pathlib import Path

from areal_hpc.config.hf import hf_config_dict
from areal_hpc.config.schema import ModelConfig
from areal_hpc.data.synthetic_tasks import tokenizer_texts
from areal_hpc.data.tokenizer import EOS, train_tokenizer


def build_tiny_model(model: ModelConfig, out_dir: str | Path, seed: int = 0, task: str = "arithmetic") -> Path:
    """Tokenizer trained on the synthetic `task` (data.synthetic_task) + randomly initialised weights
    of model.family."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_tokenizer(tokenizer_texts(task, seed), model.vocab_size, out)
    tok = AutoTokenizer.from_pretrained(str(out))
    eos = tok.convert_tokens_to_ids(EOS)
    hf = hf_config_dict(model, bos_token_id=eos, eos_token_id=eos)
    config = AutoConfig.for_model(hf.pop("model_type"), **hf)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).to(torch.float32).save_pretrained(str(out), safe_serialization=True)
    return out
