"""Checkpoint directories: one per step, complete only once every part is written and synced.

    <root>/step-00000010/trainer/          the trainer's part (written by the trainer ranks)
    <root>/step-00000010/hf/               at checkpoint.hf_interval steps and the last version:
                                           the weights as a Hugging Face directory (trainer ranks)
    <root>/step-00000010/controller.json   the controller's state
    <root>/step-00000010/config.yaml       the run's resolved config (the model's shape for export)
    <root>/step-00000010/tokenizer/        the run's tokenizer files and special token ids
    <root>/step-00000010/COMPLETE          written last, by the controller: the manifest

The manifest lists every file with its size, and a SHA-256 of each file up to HASHED_BYTES (the
controller state, metadata, small shards; hashing a 32B model's hundreds of GB of optimizer
shards on rank 0 would take longer than a step, so those are checked by size and by a hash of
their first and last MiB). Every file is fsynced before COMPLETE, and COMPLETE is written to a
temporary name, synced and renamed into place: a crash leaves either no COMPLETE or a whole one.

The hf/ files are written before the trainer reports the checkpoint saved, so they are in its
manifest: an hf/ is whole exactly when its checkpoint is, and it is pruned with it (keep_last).

A directory without COMPLETE (a job killed while writing) is ignored by `resume: auto` and
removed by the next prune; a complete one whose files no longer match its manifest (a torn copy,
a truncated shard) is skipped by `resume: auto` for the previous one, and named.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.errors import UserError

MARKER = "COMPLETE"
PREFIX = "step-"
# Files up to this size are hashed whole in the manifest; larger ones by their ends.
HASHED_BYTES = 64 << 20
_END_BYTES = 1 << 20

log = logging.getLogger(__name__)


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{PREFIX}{step:08d}"


def trainer_dir(ckpt: str | Path) -> Path:
    return Path(ckpt) / "trainer"


def hf_dir(ckpt: str | Path) -> Path:
    return Path(ckpt) / "hf"


def config_file(ckpt: str | Path) -> Path:
    return Path(ckpt) / "config.yaml"


def tokenizer_dir(ckpt: str | Path) -> Path:
    return Path(ckpt) / "tokenizer"


def is_complete(ckpt: str | Path) -> bool:
    return (Path(ckpt) / MARKER).is_file()


def _digest(path: Path, size: int) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        if size <= HASHED_BYTES:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        else:
            h.update(f.read(_END_BYTES))
            f.seek(size - _END_BYTES)
            h.update(f.read(_END_BYTES))
    return h.hexdigest()


def _files(ckpt: Path) -> list[Path]:
    return sorted(p for p in ckpt.rglob("*") if p.is_file() and p.name != MARKER and not p.name.endswith(".tmp"))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """`text` at `path`, never half-written: a synced temporary file renamed into place. `mode`
    (before the umask) holds from the file's creation on, so a secret is never readable by others:
    the temporary file is always a new one (O_EXCL), never one planted beforehand with a wider mode
    or as a symbolic link to somewhere else (O_EXCL does not follow links)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # left by a writer that died, or planted
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync(path.parent)


def mark_complete(ckpt: str | Path) -> None:
    """Sync every file of the checkpoint, then write its manifest as COMPLETE."""
    ckpt = Path(ckpt)
    manifest = {}
    for f in _files(ckpt):
        size = f.stat().st_size
        _fsync(f)
        manifest[str(f.relative_to(ckpt))] = {"bytes": size, "sha256": _digest(f, size)}
    for d in sorted({f.parent for f in _files(ckpt)} | {ckpt}):
        _fsync(d)
    write_atomic(ckpt / MARKER, json.dumps({"files": manifest}, indent=0))


def _manifest(ckpt: Path) -> list[tuple[str, int, str]] | None:
    """(file, bytes, sha256) of each file the COMPLETE manifest lists; None if it is unreadable."""
    try:
        files = json.loads((ckpt / MARKER).read_bytes())["files"]
        return [(str(name), int(want["bytes"]), str(want["sha256"])) for name, want in files.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def problems(ckpt: str | Path) -> list[str]:
    """What no longer matches the manifest of a complete checkpoint (empty: it is whole). A
    manifest that cannot be read (a torn copy, or truncated to nothing) vouches for nothing."""
    ckpt = Path(ckpt)
    wants = _manifest(ckpt)
    if wants is None:
        return [f"{MARKER}: not a readable manifest"]
    found = []
    for name, size_then, digest in wants:
        f = ckpt / name
        if not f.is_file():
            found.append(f"{name}: missing")
            continue
        size = f.stat().st_size
        if size != size_then:
            found.append(f"{name}: {size} bytes, the manifest says {size_then}")
        elif _digest(f, size) != digest:
            found.append(f"{name}: its contents changed since the checkpoint was written")
    return found


def size_of(ckpt: str | Path) -> int:
    """Bytes a complete checkpoint holds, read from its manifest (0 without a readable one)."""
    return sum(size for _, size, _ in _manifest(Path(ckpt)) or ())


# Room asked for beyond the last checkpoint's size: its files vary a little (the controller's
# state with the prompts in flight).
ROOM_MARGIN = 1.05


def no_room(root: str | Path, last: Path | None) -> str | None:
    """Why the file system of checkpoint directory `root` cannot hold another checkpoint the size
    of `last`, the newest complete one, or None. With none to go by the write is tried."""
    if last is None:
        return None
    size = size_of(last)
    free = shutil.disk_usage(root).free
    if free >= size * ROOM_MARGIN:
        return None
    return f"{root} has {free / 2**20:.1f} MiB free, and the last checkpoint ({last.name}) took {size / 2**20:.1f} MiB"


def _step_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def latest_complete(root: str | Path) -> Path | None:
    done = [p for p in _step_dirs(Path(root)) if is_complete(p)]
    return done[-1] if done else None


def prune(root: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` complete checkpoints, and incomplete ones older than
    the newest complete one; returns what was deleted."""
    dirs = _step_dirs(Path(root))
    done = [p for p in dirs if is_complete(p)]
    if not done:
        return []
    keep = set(done[-keep_last:])
    doomed = [p for p in dirs if p not in keep and p.name < done[-1].name]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def discard_all(root: str | Path) -> list[Path]:
    """Delete every checkpoint under `root` (a fresh run must never resume an older run's)."""
    dirs = _step_dirs(Path(root))
    for p in dirs:
        shutil.rmtree(p, ignore_errors=True)
    return dirs


def root_dir(cfg: ExperimentConfig) -> Path:
    """checkpoint.dir, relative to logging.dir unless absolute."""
    return Path(cfg.logging.dir) / cfg.checkpoint.dir


def resume_from(cfg: ExperimentConfig) -> Path | None:
    """The checkpoint to resume from: checkpoint.resume is 'auto', 'never' or a directory."""
    resume = cfg.checkpoint.resume
    if resume == "never":
        return None
    if resume == "auto":
        # Newest first; a damaged one is named and the previous one is used.
        for ckpt in reversed([p for p in _step_dirs(root_dir(cfg)) if is_complete(p)]):
            found = problems(ckpt)
            if not found:
                return ckpt
            log.warning("checkpoint %s is damaged (%s); trying the previous one", ckpt, "; ".join(found[:3]))
        return None
    if not is_complete(resume):
        raise UserError(f"checkpoint.resume = {resume!r}: not a complete checkpoint (no {MARKER} file)")
    found = problems(resume)
    if found:
        raise UserError(f"checkpoint.resume = {resume!r}: damaged: " + "; ".join(found[:5]))
    return Path(resume)


@dataclass
class ControllerState:
    """Everything rank 0 needs to continue a run exactly where a checkpoint left it."""

    version: int
    staleness: dict
    # Data position; prompts that were in flight are in its `returned` list, to be issued again.
    stream: dict
    # Complete groups not yet trained.
    buffer: dict
    rng: list = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)

    def save(self, ckpt: str | Path) -> None:
        """Atomic: a reader never sees a half-written file."""
        Path(ckpt).mkdir(parents=True, exist_ok=True)
        write_atomic(Path(ckpt) / "controller.json", json.dumps(asdict(self)))

    @classmethod
    def load(cls, ckpt: str | Path) -> ControllerState:
        path = Path(ckpt) / "controller.json"
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError, TypeError) as e:
            raise UserError(f"{path}: not a readable controller state ({type(e).__name__}: {e})") from None


def rng_state(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def set_rng_state(rng: random.Random, state: list) -> None:
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))
