"""Prompt data sets as users bring them: JSON lines, JSON arrays, Parquet, directories of shards
and Hugging Face dataset directories, in the layouts of config/schema.py DATA_LAYOUTS.

A row's prompt is a string or a list of chat messages (rendered later by data/chat.py); its answer
becomes the reward's reference text. A row may also carry verl's `data_source` (which reward
scores it: reward.by_source) and `extra_info` (an object passed to a custom reward function).
Rows are checked when loaded, so a bad file fails before any process starts, naming its first bad
row. JSON lines and JSON files keep a hand parser, which names the exact line of bad JSON or
non-UTF-8 bytes (shards too); Parquet and `save_to_disk` directories are read with the `datasets`
library, its cache in a temporary directory (under $TMPDIR) deleted once the rows are read.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

from areal_hpc.config.schema import DataConfig
from areal_hpc.data.arithmetic import Problem
from areal_hpc.data.synthetic_tasks import make_splits
from areal_hpc.errors import DataError
from areal_hpc.prompt_row import Message, PromptRow

# Optional fields of a row, by their verl names.
SOURCE_KEY = "data_source"
EXTRA_KEY = "extra_info"
# What marks a directory written by datasets' save_to_disk (a Dataset, a DatasetDict).
DATASET_FILE, DATASET_DICT_FILE = "state.json", "dataset_dict.json"
# The split used from a DatasetDict.
TRAIN_SPLIT = "train"
# Characters of a reader's own error kept in a DataError (datasets' cast errors print schemas).
REASON_CHARS = 400

def field_value(row: dict, key: str, where: str) -> object:
    """The value at `key`, a column name or a dotted path into nested objects; a missing or null
    value is a DataError naming the key and the keys that exist where it was looked for."""
    if key in row and row[key] is not None:
        return row[key]
    node, path = row, []
    for part in key.split("."):
        if not isinstance(node, dict) or node.get(part) is None:
            there = f"'{'.'.join(path)}' has fields" if path else "fields"
            found = ", ".join(map(str, node)) if isinstance(node, dict) else f"none, it is {node!r:.40}"
            raise DataError(f"{where}: missing field '{key}' ({there}: {found})")
        node = node[part]
        path.append(part)
    return node


def _messages(value: list, key: str, where: str) -> list[Message]:
    """Chat messages, null fields dropped (Parquet gives every message every struct field)."""
    out = []
    for i, m in enumerate(value):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise DataError(f"{where}: field '{key}' message {i}: expected {{\"role\": str, \"content\": str}},"
                            f" got {m!r:.80}")
        out.append({k: v for k, v in m.items() if v is not None})
    return out


def _prompt(value: object, key: str, where: str) -> str | list[Message]:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value:
        return _messages(value, key, where)
    raise DataError(f"{where}: field '{key}' must be a non-empty string or a list of chat messages"
                    f" ({{role, content}}), got {value!r:.80}")


def _answer(value: object, key: str, where: str) -> str:
    """The reference text: a string or number as is; a list of scalars (AReaL's `solutions`, each
    a form of the one answer) its first element; an object or other list (code tests) its JSON."""
    if isinstance(value, str | int | float):
        return str(value)
    if isinstance(value, list) and value and all(isinstance(v, str | int | float) for v in value):
        return str(value[0])
    if isinstance(value, dict | list) and value:
        return json.dumps(value)
    raise DataError(f"{where}: field '{key}' must be a string, a number, a list or an object, got {value!r:.80}")


def parse_row(row: object, prompt_key: str, answer_key: str, where: str) -> PromptRow:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object with '{prompt_key}' and '{answer_key}', got {row!r:.80}")
    prompt = _prompt(field_value(row, prompt_key, where), prompt_key, where)
    answer = _answer(field_value(row, answer_key, where), answer_key, where)
    source, extra = row.get(SOURCE_KEY), row.get(EXTRA_KEY)
    if source is not None and (not isinstance(source, str) or not source):
        raise DataError(f"{where}: field '{SOURCE_KEY}' must be a non-empty string, got {source!r:.80}")
    if extra is not None and not isinstance(extra, dict):
        raise DataError(f"{where}: field '{EXTRA_KEY}' must be an object, got {extra!r:.80}")
    return PromptRow(prompt, answer, source, extra)


# Raw rows of a source, each with where it is ("FILE: line 3") for error messages.
Located = Iterator[tuple[str, object]]


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


def _jsonl(path: Path) -> Located:
    for n, line in enumerate(_text(path).split("\n"), 1):
        if not line.strip():
            continue
        try:
            yield f"{path}: line {n}", json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: line {n}: not valid JSON ({e.msg})") from None


def _json_array(path: Path) -> Located:
    try:
        data = json.loads(_text(path))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON array of rows")
    yield from ((f"{path}: row {n}", row) for n, row in enumerate(data, 1))


def _quiet_datasets():
    """The datasets library with its progress bars and logs off: rank 0 prints one line per data
    set, and a read that fails is one DataError (datasets would log it first)."""
    import datasets

    datasets.disable_progress_bars()
    datasets.utils.logging.set_verbosity(datasets.utils.logging.CRITICAL)
    return datasets


def _columns_checked(path: Path, columns: list[str], keys: tuple[str, str]) -> None:
    for key in keys:
        column = key.split(".")[0]
        if key not in columns and column not in columns:
            of = f" for '{key}'" if column != key else ""
            raise DataError(f"{path}: no column '{column}'{of} (columns: {', '.join(columns)})")


def _unreadable(path: Path, e: BaseException) -> DataError:
    reason = " ".join(str(e.__cause__ or e).split())[:REASON_CHARS]
    return DataError(f"{path}: not a readable Parquet file ({reason})")


def _with_rows(path: Path, files: list[Path]) -> list[Path]:
    """The Parquet files that hold rows, from their footers (datasets refuses a file of none with
    an error about batch sizes)."""
    import pyarrow.parquet as pq

    try:
        return [f for f in files if pq.read_metadata(f).num_rows > 0]
    except Exception as e:  # pyarrow raises several types for a damaged footer
        raise _unreadable(path, e) from None


def _parquet(path: Path, files: list[Path], keys: tuple[str, str]) -> Located:
    datasets = _quiet_datasets()
    files = _with_rows(path, files)
    if not files:
        return
    with tempfile.TemporaryDirectory(prefix="areal-hpc-datasets-") as cache:
        try:
            table = datasets.load_dataset("parquet", data_files=[str(f) for f in files], split=TRAIN_SPLIT,
                                          cache_dir=cache)
        except Exception as e:  # pyarrow and datasets raise several types for unreadable files
            raise _unreadable(path, e) from None
        _columns_checked(path, table.column_names, keys)
        rows = table.to_list()
    yield from ((f"{path}: row {n}", row) for n, row in enumerate(rows, 1))


def _saved_dataset(path: Path, keys: tuple[str, str]) -> Located:
    datasets = _quiet_datasets()
    try:
        saved = datasets.load_from_disk(str(path))
    except Exception as e:  # a damaged directory raises from datasets, pyarrow or json
        raise DataError(f"{path}: not a readable datasets directory ({str(e).splitlines()[0]})") from None
    if isinstance(saved, datasets.DatasetDict):
        if TRAIN_SPLIT not in saved:
            raise DataError(f"{path}: a DatasetDict without a '{TRAIN_SPLIT}' split (splits: {', '.join(saved)});"
                            f" point the path at the split's directory, e.g. {path / next(iter(saved))}")
        saved = saved[TRAIN_SPLIT]
    _columns_checked(path, saved.column_names, keys)
    yield from ((f"{path}: row {n}", row) for n, row in enumerate(saved.to_list(), 1))


def _directory(path: Path, keys: tuple[str, str]) -> Located:
    """A save_to_disk directory, or shards of one kind in name order (rows numbered in that order
    for Parquet; JSON lines shards name their own file and line)."""
    if (path / DATASET_FILE).is_file() or (path / DATASET_DICT_FILE).is_file():
        return _saved_dataset(path, keys)
    parquet, jsonl = sorted(path.glob("*.parquet")), sorted(path.glob("*.jsonl"))
    if parquet and jsonl:
        raise DataError(f"{path}: holds both *.parquet and *.jsonl shards; keep one kind per directory")
    if parquet:
        return _parquet(path, parquet, keys)
    if jsonl:
        return (located for shard in jsonl for located in _jsonl(shard))
    raise DataError(f"{path}: a directory with no *.parquet or *.jsonl shards and not written by"
                    " datasets' save_to_disk (no state.json or dataset_dict.json)")


def _located_rows(path: Path, keys: tuple[str, str]) -> Located:
    if path.is_dir():
        return _directory(path, keys)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    if path.suffix == ".jsonl":
        return _jsonl(path)
    if path.suffix == ".json":
        return _json_array(path)
    if path.suffix == ".parquet":
        return _parquet(path, [path], keys)
    raise DataError(f"{path}: unknown format '{path.suffix}' (use .jsonl, .json, .parquet or a dataset directory)")


def load_prompts(path: str | Path, data: DataConfig) -> list[PromptRow]:
    """Rows of a file or dataset directory, read by data.layout and its keys; raises DataError
    naming the first bad row."""
    path = Path(path)
    prompt_key, answer_key = keys = data.row_keys()
    rows = [parse_row(row, prompt_key, answer_key, where) for where, row in _located_rows(path, keys)]
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


# A held-out data set: its name (the file's stem) and its rows.
HeldOutSet = tuple[str, list[PromptRow]]


def train_and_eval_prompts(data: DataConfig, seed: int,
                           eval_paths: list[str] | None = None) -> tuple[list[PromptRow], list[HeldOutSet]]:
    """The training prompts and the held-out sets: `eval_paths` (eval.paths) if any, else
    data.eval_path; the synthetic task fills unset paths."""
    train, held_out = make_splits(data, seed, data.synthetic_train_size, data.synthetic_eval_size)

    def synthetic(problems: list[Problem]) -> list[PromptRow]:
        return [PromptRow(p.prompt, p.answer) for p in problems]

    train_rows = load_prompts(data.train_path, data) if data.train_path is not None else synthetic(train)
    paths = eval_paths or ([data.eval_path] if data.eval_path is not None else [])
    if not paths:
        return train_rows, [("synthetic", synthetic(held_out))]
    return train_rows, [(Path(p).stem, load_prompts(p, data)) for p in paths]
