"""Checkpoint directories: completeness marker, `resume: auto`, pruning, controller state."""

from __future__ import annotations

import json
import random

import pytest

from areal_hpc.config.load import load_config
from areal_hpc.controller import checkpoint as ck
from areal_hpc.errors import UserError


def make(root, step: int, complete: bool):
    d = ck.step_dir(root, step)
    ck.trainer_dir(d).mkdir(parents=True)
    if complete:
        ck.mark_complete(d)
    return d


def test_latest_complete_ignores_incomplete_and_prune_keeps_the_newest(tmp_path):
    assert ck.latest_complete(tmp_path / "none") is None
    make(tmp_path, 10, True)
    make(tmp_path, 20, True)
    make(tmp_path, 25, False)  # killed while writing
    make(tmp_path, 30, True)
    make(tmp_path, 40, False)  # being written now
    assert ck.latest_complete(tmp_path) == ck.step_dir(tmp_path, 30)
    deleted = ck.prune(tmp_path, keep_last=2)
    assert sorted(p.name for p in deleted) == ["step-00000010", "step-00000025"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000020", "step-00000030", "step-00000040"]


def test_resume_modes(tmp_path):
    cfg = load_config("configs/experiments/tiny-cpu.yaml", [f"logging.dir={tmp_path}"])
    assert ck.resume_from(cfg) is None
    d = make(ck.root_dir(cfg), 10, True)
    make(ck.root_dir(cfg), 20, False)
    assert ck.resume_from(cfg) == d
    cfg.checkpoint.resume = "never"
    assert ck.resume_from(cfg) is None
    cfg.checkpoint.resume = str(ck.step_dir(ck.root_dir(cfg), 20))
    with pytest.raises(UserError, match="not a complete checkpoint"):
        ck.resume_from(cfg)


def test_controller_state_round_trip_with_rng(tmp_path):
    rng = random.Random(5)
    rng.random()
    state = ck.ControllerState(
        version=3,
        staleness={"version": 3, "accepted": 40, "running": 0},
        stream={"position": 50, "returned": [44, 47]},
        buffer={"seq": 50, "ready": []},
        rng=ck.rng_state(rng),
        counters={"trained_tokens": 1234.0},
    )
    state.save(tmp_path)
    loaded = ck.ControllerState.load(tmp_path)
    assert loaded == state
    other = random.Random()
    ck.set_rng_state(other, loaded.rng)
    assert other.random() == rng.random()


def test_discard_all_removes_every_checkpoint(tmp_path):
    make(tmp_path, 10, True)
    make(tmp_path, 20, False)
    (tmp_path / "notes.txt").write_text("kept")
    assert sorted(p.name for p in ck.discard_all(tmp_path)) == ["step-00000010", "step-00000020"]
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    assert ck.discard_all(tmp_path / "absent") == []


def written(root, step: int, shard_bytes: int = 1000):
    """A complete checkpoint with a small and, when asked, a large trainer shard."""
    d = ck.step_dir(root, step)
    ck.trainer_dir(d).mkdir(parents=True)
    (ck.trainer_dir(d) / "metadata.json").write_text(f'{{"step": {step}}}')
    (ck.trainer_dir(d) / "__0_0.distcp").write_bytes(bytes(range(256)) * (shard_bytes // 256 + 1))
    ck.ControllerState(version=step, staleness={}, stream={}, buffer={}).save(d)
    ck.mark_complete(d)
    return d


def test_the_manifest_names_what_changed_since_the_checkpoint(tmp_path, monkeypatch):
    d = written(tmp_path, 10)
    assert ck.problems(d) == []
    (ck.trainer_dir(d) / "metadata.json").write_text('{"step": 11}')  # same size, other bytes
    shard = ck.trainer_dir(d) / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])  # truncated
    (d / "controller.json").unlink()
    found = ck.problems(d)
    assert found == ["controller.json: missing", "trainer/__0_0.distcp: 100 bytes, the manifest says 1024",
                     "trainer/metadata.json: its contents changed since the checkpoint was written"]
    # A large shard is hashed by its ends: a change there is found.
    monkeypatch.setattr(ck, "HASHED_BYTES", 2 << 20)
    big = written(tmp_path, 20, shard_bytes=3 << 20)
    data = bytearray((ck.trainer_dir(big) / "__0_0.distcp").read_bytes())
    data[-1] ^= 1
    (ck.trainer_dir(big) / "__0_0.distcp").write_bytes(bytes(data))
    assert ck.problems(big) == ["trainer/__0_0.distcp: its contents changed since the checkpoint was written"]


def test_resume_auto_skips_a_damaged_newest_checkpoint_and_says_so(tmp_path, caplog):
    cfg = load_config("configs/experiments/tiny-cpu.yaml", [f"logging.dir={tmp_path}"])
    older = written(ck.root_dir(cfg), 10)
    newest = written(ck.root_dir(cfg), 20)
    (ck.trainer_dir(newest) / "__0_0.distcp").write_bytes(b"torn")
    with caplog.at_level("WARNING"):
        assert ck.resume_from(cfg) == older
    assert f"checkpoint {newest} is damaged (trainer/__0_0.distcp: 4 bytes" in caplog.text
    cfg.checkpoint.resume = str(newest)
    with pytest.raises(UserError, match="damaged: trainer/__0_0.distcp: 4 bytes"):
        ck.resume_from(cfg)


def test_a_corrupt_controller_state_is_a_clear_error(tmp_path):
    d = written(tmp_path, 10)
    (d / "controller.json").write_text('{"version": 10, "stag')
    with pytest.raises(UserError, match="controller.json: not a readable controller state"):
        ck.ControllerState.load(d)


def test_write_atomic_never_writes_through_a_planted_temporary_file(tmp_path):
    """A file or link planted where the temporary file goes (a run directory others can write)
    neither receives the secret with its own wider mode nor redirects the write elsewhere."""
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    target = tmp_path / "join.json"
    for planted in ("file", "link"):
        tmp = tmp_path / "join.json.tmp"
        if planted == "file":
            tmp.write_text("")
            tmp.chmod(0o666)
        else:
            tmp.symlink_to(victim)
        ck.write_atomic(target, "secret", mode=0o600)
        assert target.read_text() == "secret" and target.stat().st_mode & 0o777 == 0o600
        assert not target.is_symlink() and not tmp.exists() and victim.read_text() == "untouched"
        target.unlink()


def test_no_room_is_judged_by_the_last_checkpoints_size_on_its_file_system(tmp_path):
    assert ck.no_room(tmp_path, None) is None  # nothing to go by: the first one is tried
    last = make(tmp_path, 2, True)
    (ck.trainer_dir(last) / "weights").write_bytes(b"x" * 4096)
    ck.mark_complete(last)
    assert ck.size_of(last) == 4096
    assert ck.no_room(tmp_path, last) is None
    manifest = json.loads((last / ck.MARKER).read_text())
    manifest["files"]["trainer/weights"]["bytes"] = 2**60  # a checkpoint no disk holds
    (last / ck.MARKER).write_text(json.dumps(manifest))
    why = ck.no_room(tmp_path, last)
    assert why is not None and why.startswith(f"{tmp_path} has ") and "MiB free, and the last checkpoint" in why
    assert "(step-00000002) took 1099511627776.0 MiB" in why
    assert ck.size_of(tmp_path / "none") == 0
