"""Build the tiny Qwen2 of the CPU profile as a Hugging Face directory (random weights).

The directory is what a real checkpoint looks like (config.json, model.safetensors, tokenizer
files), so the trainer's converter and vLLM load it through their real loading code.
"""

from __future__ import annotations

from pathlib import Path

from areal_hpc.config.hf import hf_config_dict
from areal_hpc.config.schema import ModelConfig
from areal_hpc.data.arithmetic import make_splits
from areal_hpc.data.tokenizer import EOS, train_tokenizer


def build_tiny_model(model: ModelConfig, out_dir: str | Path, seed: int = 0) -> Path:
    """Tokenizer trained on the arithmetic task + randomly initialised Qwen2 weights."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, _ = make_splits(seed, 2000, 1)
    train_tokenizer((p.prompt + p.solution for p in train), model.vocab_size, out)
    tok = AutoTokenizer.from_pretrained(str(out))
    eos = tok.convert_tokens_to_ids(EOS)
    config = Qwen2Config(**hf_config_dict(model, bos_token_id=eos, eos_token_id=eos))
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).to(torch.float32).save_pretrained(str(out), safe_serialization=True)
    return out
