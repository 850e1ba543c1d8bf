"""A directory that holds no usable tokenizer is named in one line of our own, never a cut
message of transformers' (hub repository ids, slow-tokenizer conversion)."""

from __future__ import annotations

import pytest

from areal_hpc.cli import main
from areal_hpc.data.chat import load_tokenizer
from areal_hpc.errors import DataError


@pytest.mark.parametrize("make, message", [
    (lambda d: d, "{d}: not a tokenizer directory: none of tokenizer.json, tokenizer_config.json, tokenizer.model,"
                  " vocab.json, vocab.txt in it"),
    (lambda d: d / "missing", "{d}/missing: no such directory (a tokenizer is a model's or a tokenizer's directory)"),
    (lambda d: (d / "file").write_text("x") and d / "file",
     "{d}/file: not a directory (a tokenizer is a model's or a tokenizer's directory)"),
])
def test_not_a_tokenizer_is_one_line(tmp_path, make, message: str) -> None:
    with pytest.raises(DataError) as info:
        load_tokenizer(make(tmp_path))
    assert str(info.value) == message.format(d=tmp_path)


def test_an_unreadable_tokenizer_file_says_what_transformers_said_in_one_line(tmp_path) -> None:
    (tmp_path / "tokenizer.json").write_text('{"version":')
    with pytest.raises(DataError, match=rf"^{tmp_path}: transformers cannot load the tokenizer: \S") as info:
        load_tokenizer(tmp_path)
    assert "\n" not in str(info.value)


def test_data_check_with_an_empty_tokenizer_directory(capsys, tmp_path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+1?", "answer": "2"}\n')
    (tmp_path / "tok").mkdir()
    assert main(["data", "check", str(data), "--config", "configs/experiments/tiny-cpu.yaml", "--tokenizer",
                 str(tmp_path / "tok")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {tmp_path}/tok: not a tokenizer directory: none of tokenizer.json, tokenizer_config.json," \
                  " tokenizer.model, vocab.json, vocab.txt in it\n"
