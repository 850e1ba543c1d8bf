"""Tiny tokenizers (trained here, no hub), with and without a chat template."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from chat_data import TEMPLATE

from areal_hpc.data.arithmetic import make_splits
from areal_hpc.data.tokenizer import train_tokenizer


@pytest.fixture(scope="session")
def plain_tokenizer_dir(tmp_path_factory) -> Path:
    """A byte-level BPE tokenizer of 300 tokens with no chat template."""
    out = tmp_path_factory.mktemp("plain-tokenizer")
    train, _ = make_splits(0, 200, 1)
    train_tokenizer([p.prompt + p.solution for p in train] + ["SYSTEM: USER: ASSISTANT:"], 300, out)
    return out


@pytest.fixture(scope="session")
def chat_tokenizer_dir(tmp_path_factory, plain_tokenizer_dir) -> Path:
    """The same tokenizer with TEMPLATE as its chat template, saved as a model directory keeps it."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("chat-tokenizer")
    shutil.copytree(plain_tokenizer_dir, out, dirs_exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(out))
    tok.chat_template = TEMPLATE
    tok.save_pretrained(str(out))
    return out
