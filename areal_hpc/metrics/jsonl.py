"""The run's JSON-lines logs (metrics.jsonl, ledger.jsonl, weights.jsonl): read so that a crash's
torn last line costs that line and nothing else, and cut back on resume by writing a new file and
renaming it over the old one, so a crash mid-rewrite leaves the old file whole."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)


class LogError(ValueError):
    """A line other than the last is not JSON: the file was edited or damaged, not torn by a crash."""


def read_records(path: str | Path) -> list[dict]:
    """Every record of `path` ([] if it does not exist). A last line that is not JSON is the one a
    crash tore while writing: dropped, with a warning."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_text(errors="replace").splitlines()
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            if n == len(lines):
                log.warning("%s: dropped its torn last line %d (%s)", path, n, e)
                break
            raise LogError(f"{path}: line {n} is not JSON ({e})") from None
    return records


def rewrite_records(path: str | Path, records: Iterable[dict]) -> None:
    """Replace `path` by `records`, atomically."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
