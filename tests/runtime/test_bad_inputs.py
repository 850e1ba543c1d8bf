"""Bad input swept through the launch's preflight: data files and model directories a user may
bring. Each is refused with one UserError naming the file and the problem, before any process
starts, and the run directory is left as it was (nothing in it but the run lock). The counts of
cases by kind are in benchmarks/RESULTS.md."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file, save_file

from areal_hpc.config.load import load_config
from areal_hpc.errors import UserError
from areal_hpc.runtime.preflight import preflight
from areal_hpc.runtime.run_lock import LOCK_FILE

CONFIG = "configs/experiments/tiny-cpu.yaml"
ROWS = [{"prompt": f"{i} + 1 =", "answer": str(i + 1)} for i in range(8)]
# Bytes of the one long line: a user's concatenated file, or a prompt that is a whole book.
LONG_LINE_BYTES = 100 << 20


def refused(tmp_path: Path, overrides: list[str], config: str | Path = CONFIG) -> str:
    """preflight's UserError for `config` with `overrides`; the run directory holds only the lock
    afterwards (or was never made: the config's own check refused it)."""
    run_dir = tmp_path / "run"
    overrides = [f"logging.dir={run_dir}", *overrides]
    with pytest.raises(UserError) as info:
        preflight(str(config), overrides, load_config(CONFIG).world_size)
    assert not run_dir.exists() or sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]
    assert "Traceback" not in str(info.value)
    return str(info.value)


def shape_from_the_model(tmp_path: Path) -> Path:
    """The tiny config with no model shape written: model.path's config.json gives it, as a
    user's config of a downloaded model does."""
    text = Path(CONFIG).read_text().replace("base: [../models/tiny-qwen2.yaml]\n", "")
    assert "base:" not in text
    path = tmp_path / "no-shape.yaml"
    path.write_text(text + "model: {name: tiny}\n")
    return path


def parquet(path: Path, table: pa.Table) -> Path:
    pq.write_table(table, path)
    return path


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def truncated(path: Path, keep: float) -> Path:
    os.truncate(path, int(path.stat().st_size * keep))
    return path


def long_line(path: Path, closed: bool) -> Path:
    """One JSON line of LONG_LINE_BYTES, written in pieces: a prompt of that length (`closed`), or
    the same line cut before its end."""
    with path.open("w") as f:
        f.write('{"answer": "1", "prompt": "')
        piece = "one two three four " * 1024
        for _ in range(LONG_LINE_BYTES // len(piece)):
            f.write(piece)
        f.write('"}\n' if closed else "")
    return path


# name -> (write the file into a directory, what the error must say)
DATA: dict[str, tuple[Callable[[Path], Path], str]] = {
    "binary bytes as .jsonl": (lambda d: _write(d / "t.jsonl", os.urandom(4096) + b"\xff"),
                               r"t.jsonl: line \d+: not UTF-8 text"),
    "binary bytes as .parquet": (lambda d: _write(d / "t.parquet", os.urandom(4096)),
                                 r"t.parquet: not a readable Parquet file"),
    "parquet truncated to half": (lambda d: truncated(parquet(d / "t.parquet", pa.Table.from_pylist(ROWS)), 0.5),
                                  r"t.parquet: not a readable Parquet file"),
    "empty .jsonl": (lambda d: _write(d / "t.jsonl", b""), r"t.jsonl: no rows"),
    "empty .parquet (0 bytes)": (lambda d: _write(d / "t.parquet", b""), r"t.parquet: not a readable Parquet file"),
    "parquet with its columns and no rows": (
        lambda d: parquet(d / "t.parquet", pa.table({"prompt": pa.array([], pa.string()),
                                                     "answer": pa.array([], pa.string())})), r"t.parquet: no rows"),
    "a 100 MB line cut before its end": (lambda d: long_line(d / "t.jsonl", closed=False),
                                         r"t.jsonl: line 1: not valid JSON"),
    "a 100 MB prompt": (lambda d: long_line(d / "t.jsonl", closed=True),
                        r"t.jsonl: 1 of 1 prompts are longer than rollout.max_prompt_len = \d+ tokens: row 1"),
    "prompt column of integers": (
        lambda d: parquet(d / "t.parquet", pa.table({"prompt": list(range(4)), "answer": ["1"] * 4})),
        r"t.parquet: row 1: field 'prompt' must be a non-empty string or a list of chat messages"),
    "answer column of nulls": (
        lambda d: parquet(d / "t.parquet", pa.table({"prompt": ["1 + 1 ="] * 4, "answer": pa.nulls(4, pa.string())})),
        r"t.parquet: row 1: missing field 'answer'"),
    "answer column of bytes that are not UTF-8": (
        lambda d: parquet(d / "t.parquet", pa.table({"prompt": ["1 + 1 ="] * 2, "answer": pa.array([b"\xff", b"2"])})),
        r"t.parquet: row 1: field 'answer' must be a string, a number, a list or an object, got b'\\xff'"),
    "non-UTF-8 in an answer of a .jsonl": (
        lambda d: _write(d / "t.jsonl", b'{"prompt": "1 + 1 =", "answer": "2"}\n{"prompt": "2 + 1 =", "answer": "\xe9"}\n'),
        r"t.jsonl: line 2: not UTF-8 text \(byte 0xe9"),
    "no prompt column": (lambda d: parquet(d / "t.parquet", pa.table({"question": ["1 + 1 ="], "answer": ["2"]})),
                         r"t.parquet: no column 'prompt' \(columns: question, answer\)"),
    "a prompt longer than the context (data.overlong: error)": (
        lambda d: jsonl(d / "t.jsonl", [*ROWS, {"prompt": "1 + " * 600 + "1 =", "answer": "601"}]),
        r"t.jsonl: 1 of 9 prompts are longer than rollout.max_prompt_len = \d+ tokens: row 9 \(\d+ tokens\)"),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", DATA)
def test_a_bad_data_file_is_named_at_preflight(tmp_path, tiny_model_dir, case):
    make, said = DATA[case]
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    path = make(data_dir)
    message = refused(tmp_path, [f"model.path={tiny_model_dir}", f"data.train_path={path}", "data.overlong=error"])
    assert str(path) in message, message
    assert re.search(said, message), message


def _edit_config(model: Path, **fields) -> None:
    config = json.loads((model / "config.json").read_text())
    config.update(fields)
    (model / "config.json").write_text(json.dumps(config))


def _edit_tensors(model: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    tensors = load_file(model / "model.safetensors")
    edit(tensors)
    save_file(tensors, model / "model.safetensors")


def _extra_tokens(model: Path, count: int) -> None:
    """The tokenizer gains `count` added tokens past the model's vocabulary."""
    tok = json.loads((model / "tokenizer.json").read_text())
    first = len(tok["model"]["vocab"])
    tok["added_tokens"] += [{"id": first + i, "content": f"<|extra_{i}|>", "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True} for i in range(count)]
    (model / "tokenizer.json").write_text(json.dumps(tok))


def _sharded(model: Path, index: str | None) -> None:
    """The weights as two shards and an index; `index` replaces the index's text when given."""
    tensors = load_file(model / "model.safetensors")
    (model / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, model / file)
    weight_map = {n: file for file, part in halves.items() for n in part}
    text = json.dumps({"weight_map": weight_map}) if index is None else index
    (model / "model.safetensors.index.json").write_text(text)


EMBED = "model.embed_tokens.weight"
# name -> (damage a copy of the tiny model, what the error must say)
MODEL: dict[str, tuple[Callable[[Path], None], str]] = {
    "config.json says a wider model than its weights": (
        lambda m: _edit_config(m, hidden_size=256, intermediate_size=768),
        rf"the tensors are not those of a Qwen2ForCausalLM of its config.json's shape: wrong shapes: .*{EMBED}"
        r" \[512, 128\] \(expected \[512, 256\]\)"),
    "config.json says more layers than its weights": (
        lambda m: _edit_config(m, num_hidden_layers=6, layer_types=["full_attention"] * 6, max_window_layers=6),
        r"missing tensors: model.layers.4.input_layernorm.weight"),
    "config.json is not JSON": (lambda m: (m / "config.json").write_text('{"hidden_size": 12'),
                                r"config.json"),
    "a tokenizer whose vocabulary exceeds the model's": (
        lambda m: _extra_tokens(m, 3),
        r"has 515 tokens, more than the model's vocab_size = 512 .*config.json\): ids from 512 on have no embedding"),
    "model.safetensors truncated to half": (lambda m: truncated(m / "model.safetensors", 0.5),
                                            r"model.safetensors: not a readable safetensors file .*truncated"),
    "model.safetensors cut inside its header": (lambda m: truncated(m / "model.safetensors", 0.001),
                                                r"model.safetensors: not a readable safetensors file"),
    "model.safetensors that is text": (lambda m: (m / "model.safetensors").write_text("version https://git-lfs\n"),
                                       r"model.safetensors: not a readable safetensors file"),
    "a tensor of the wrong shape": (
        lambda m: _edit_tensors(m, lambda t: t.update({EMBED: t[EMBED][:, :64].contiguous()})),
        rf"wrong shapes: {EMBED} \[512, 64\] \(expected \[512, 128\]\)"),
    "a tensor missing": (lambda m: _edit_tensors(m, lambda t: t.pop("model.norm.weight")),
                         r"missing tensors: model.norm.weight"),
    "an index that is not JSON": (lambda m: _sharded(m, index="{"),
                                  r"model.safetensors.index.json: not a readable safetensors index"),
    "an index without a weight_map": (lambda m: _sharded(m, index='{"metadata": {}}'),
                                      r"model.safetensors.index.json: not a readable safetensors index"),
    "an index naming a shard that is not there": (
        lambda m: (_sharded(m, index=None), (m / "model-00002-of-00002.safetensors").unlink()),
        r"model-00002-of-00002.safetensors: listed in model.safetensors.index.json for .* but missing"),
    "a shard truncated": (
        lambda m: (_sharded(m, index=None), truncated(m / "model-00001-of-00002.safetensors", 0.9)),
        r"model-00001-of-00002.safetensors: not a readable safetensors file"),
}


@pytest.mark.parametrize("case", MODEL)
def test_a_bad_model_directory_is_named_at_preflight(tmp_path, tiny_model_dir, case):
    damage, said = MODEL[case]
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    damage(model)
    message = refused(tmp_path, [f"model.path={model}"], shape_from_the_model(tmp_path))
    assert str(model) in message, message
    assert re.search(said, message), message
