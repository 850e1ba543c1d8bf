"""Checkpoint directories: one per step, complete only once every part is written.

    <root>/step-00000010/trainer/          the trainer's part (written by the trainer ranks)
    <root>/step-00000010/controller.json   the controller's state
    <root>/step-00000010/COMPLETE          written last, by the controller

A directory without COMPLETE (a job killed while writing) is ignored by `resume: auto` and
removed by the next prune.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.errors import UserError

MARKER = "COMPLETE"
PREFIX = "step-"


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{PREFIX}{step:08d}"


def trainer_dir(ckpt: str | Path) -> Path:
    return Path(ckpt) / "trainer"


def is_complete(ckpt: str | Path) -> bool:
    return (Path(ckpt) / MARKER).is_file()


def mark_complete(ckpt: str | Path) -> None:
    (Path(ckpt) / MARKER).write_text("")


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
        return latest_complete(root_dir(cfg))
    if not is_complete(resume):
        raise UserError(f"checkpoint.resume = {resume!r}: not a complete checkpoint (no {MARKER} file)")
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
        path = Path(ckpt) / "controller.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)

    @classmethod
    def load(cls, ckpt: str | Path) -> ControllerState:
        return cls(**json.loads((Path(ckpt) / "controller.json").read_text()))


def rng_state(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def set_rng_state(rng: random.Random, state: list) -> None:
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))
