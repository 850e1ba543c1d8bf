"""Prompt data sets: JSON lines, JSON arrays and Parquet files with a prompt and an answer field.

This is the format of AReaL's and DeepScaleR's math data. A row may also carry verl's
`data_source` (which reward scores it: reward.by_source) and `extra_info` (an object passed to a
custom reward function). Rows are checked when loaded, so a bad file fails before any process
starts, with the row (line) number of the first bad row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from areal_hpc.config.schema import DataConfig
from areal_hpc.data.arithmetic import Problem, make_splits
from areal_hpc.errors import UserError

# Optional fields of a row, by their verl names.
SOURCE_KEY = "data_source"
EXTRA_KEY = "extra_info"


@dataclass(frozen=True)
class PromptRow:
    prompt: str
    answer: str
    data_source: str | None = None
    extra_info: dict | None = None


class DataError(UserError):
    """A prompt file that cannot be used."""


def parse_row(row: object, prompt_key: str, answer_key: str, where: str) -> PromptRow:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object with '{prompt_key}' and '{answer_key}', got {row!r:.80}")
    for key in (prompt_key, answer_key):
        if key not in row or row[key] is None:
            raise DataError(f"{where}: missing field '{key}' (fields: {', '.join(map(str, row))})")
    prompt, answer = row[prompt_key], row[answer_key]
    if not isinstance(prompt, str) or not prompt:
        raise DataError(f"{where}: field '{prompt_key}' must be a non-empty string, got {prompt!r:.80}")
    if not isinstance(answer, str | int | float):
        raise DataError(f"{where}: field '{answer_key}' must be a string or a number, got {answer!r:.80}")
    source, extra = row.get(SOURCE_KEY), row.get(EXTRA_KEY)
    if source is not None and (not isinstance(source, str) or not source):
        raise DataError(f"{where}: field '{SOURCE_KEY}' must be a non-empty string, got {source!r:.80}")
    if extra is not None and not isinstance(extra, dict):
        raise DataError(f"{where}: field '{EXTRA_KEY}' must be an object, got {extra!r:.80}")
    return PromptRow(prompt, str(answer), source, extra)


def _not_utf8(path: Path, data: bytes, e: UnicodeDecodeError) -> DataError:
    line = data.count(b"\n", 0, e.start) + 1
    return DataError(f"{path}: line {line}: not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start});"
                     " convert the file to UTF-8")


def _text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _not_utf8(path, data, e) from None


def _jsonl(path: Path, prompt_key: str, answer_key: str) -> list[PromptRow]:
    rows = []
    for n, line in enumerate(_text(path).split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: line {n}: not valid JSON ({e.msg})") from None
        rows.append(parse_row(row, prompt_key, answer_key, f"{path}: line {n}"))
    return rows


def _json_array(path: Path, prompt_key: str, answer_key: str) -> list[PromptRow]:
    try:
        data = json.loads(_text(path))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON array of rows")
    return [parse_row(row, prompt_key, answer_key, f"{path}: row {n}") for n, row in enumerate(data, 1)]


def _parquet(path: Path, prompt_key: str, answer_key: str) -> list[PromptRow]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for unreadable files
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None
    for key in (prompt_key, answer_key):
        if key not in table.column_names:
            raise DataError(f"{path}: no column '{key}' (columns: {', '.join(table.column_names)})")
    columns = [prompt_key, answer_key] + [key for key in (SOURCE_KEY, EXTRA_KEY) if key in table.column_names]
    return [
        parse_row(row, prompt_key, answer_key, f"{path}: row {n}")
        for n, row in enumerate(table.select(columns).to_pylist(), 1)
    ]


def load_prompts(path: str | Path, prompt_key: str = "prompt", answer_key: str = "answer") -> list[PromptRow]:
    """Rows of a .jsonl, .json or .parquet file; raises DataError naming the first bad row."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    readers = {".jsonl": _jsonl, ".json": _json_array, ".parquet": _parquet}
    reader = readers.get(path.suffix)
    if reader is None:
        raise DataError(f"{path}: unknown format '{path.suffix}' (use {', '.join(readers)})")
    rows = reader(path, prompt_key, answer_key)
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def train_and_eval_prompts(data: DataConfig, seed: int) -> tuple[list[PromptRow], list[PromptRow]]:
    """The training and held-out prompts of a DataConfig; the synthetic task fills unset paths."""
    train, held_out = make_splits(seed, data.synthetic_train_size, data.synthetic_eval_size)

    def pick(path: str | None, synthetic: list[Problem]) -> list[PromptRow]:
        if path is not None:
            return load_prompts(path, data.prompt_key, data.answer_key)
        return [PromptRow(p.prompt, p.answer) for p in synthetic]

    return pick(data.train_path, train), pick(data.eval_path, held_out)
