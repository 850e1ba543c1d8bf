"""The checkpoint directory on a disk that fills up: a 24 MiB tmpfs, room for one checkpoint of
the tiny model (about 15 MiB) and a half. The first checkpoint is written; the next finds no room
by the first one's size and is skipped with a warning while the run goes on; the run's last one is
tried anyway, fails for lack of space and ends the job naming the trainer, and the complete checkpoint is
left whole as the point a requeue resumes from."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from mpi_jobs import run_job

from areal_hpc.controller import checkpoint as ck

pytestmark = [pytest.mark.slow, pytest.mark.faults]


@pytest.fixture
def small_disk(tmp_path: Path):
    where = tmp_path / "checkpoints"
    where.mkdir()
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(where)], capture_output=True,
                         text=True)
    if got.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {got.stderr.strip()}")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_checkpoint_disk_skips_checkpoints_then_ends_naming_it(tmp_path, tiny_model_dir, small_disk):
    job = run_job(3, [f"logging.dir={tmp_path}", f"model.path={tiny_model_dir}", "total_steps=6",
                      "rollout.batch_prompts=4", "rollout.group_size=4", "rollout.max_new_tokens=64",
                      "data.synthetic_eval_size=4", "eval.n=1", "checkpoint.interval_steps=2",
                      "checkpoint.keep_last=1", "logging.tensorboard=false"], timeout=420)
    out = job.output
    first, second = ck.step_dir(small_disk, 2), ck.step_dir(small_disk, 4)
    assert ck.is_complete(first) and ck.problems(first) == [], out[-5000:]
    assert 10 * 2**20 < ck.size_of(first) < 16 * 2**20  # what the tmpfs's size was chosen for
    assert f"checkpoint of version 4 not written: {small_disk} has " in out, out[-5000:]
    assert "and the last checkpoint (step-00000002) took" in out
    assert f"a restart resumes from {first}" in out
    assert not second.exists()
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "trained_tokens" in r] == [1, 2, 3, 4, 5, 6]
    assert job.returncode != 0
    # Megatron's distributed checkpoint names the full disk only as "unexpected pos N vs M" (a
    # hole: the error should say the disk is full); the job does end naming the trainer.
    assert "error: rank 1 (trainer 0) failed: CheckpointException" in out, out[-5000:]
    assert not ck.is_complete(ck.step_dir(small_disk, 6))
    assert ck.latest_complete(small_disk) == first and ck.problems(first) == []
