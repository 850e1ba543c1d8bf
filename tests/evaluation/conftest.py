"""Evaluation fixtures: a tiny random Qwen2 (hidden 64, 2 layers, vocab 512) with the project's
tokenizer, and held-out rows of the synthetic arithmetic task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def eval_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from areal_hpc.data.arithmetic import make_splits
    from areal_hpc.data.tokenizer import EOS, train_tokenizer

    out = tmp_path_factory.mktemp("eval-qwen2")
    train, _ = make_splits(0, 500, 1)
    train_tokenizer((p.prompt + p.solution for p in train), 512, out)
    eos = AutoTokenizer.from_pretrained(str(out)).convert_tokens_to_ids(EOS)
    config = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         bos_token_id=eos, eos_token_id=eos, tie_word_embeddings=False)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(torch.float32).save_pretrained(str(out), safe_serialization=True)
    return out


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="session")
def arithmetic_prompts() -> list[str]:
    from areal_hpc.data.arithmetic import make_splits

    _, held_out = make_splits(0, 10, 8)
    return [p.prompt for p in held_out]
