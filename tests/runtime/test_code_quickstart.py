"""`make quickstart-code` shortened to two steps: the programs task through the real launcher, the
warm start and the code reward in the sandbox. The warm start stops at its first validation (a
greedy accuracy of 0.1 is reached by then), so a fresh machine pays under a minute for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mpi_jobs import run_job

from areal_hpc.config.schema import RewardConfig

pytestmark = pytest.mark.slow

CONFIG = "configs/experiments/quickstart-code.yaml"
STEPS, B, GROUP, EVAL_PROMPTS = 2, 4, 4, 8


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_two_steps_of_the_code_quickstart(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job = run_job(3, [
        f"logging.dir={run_dir}", f"total_steps={STEPS}", f"rollout.batch_prompts={B}",
        f"rollout.group_size={GROUP}", "rollout.max_concurrent=8", f"data.synthetic_eval_size={EVAL_PROMPTS}",
        "eval_interval=0", "checkpoint.interval_steps=0", "checkpoint.resume=never", "logging.tensorboard=false",
        "data.synthetic_warm_start_accuracy=0.1", "data.synthetic_warm_start_slips=0",
    ], timeout=900, config=CONFIG)
    assert job.returncode == 0, job.output[-5000:]
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records if "trained_tokens" in r] == [1, 2]
    assert [r["step"] for r in records if "eval_accuracy" in r] == [0, STEPS]
    rows = read_jsonl(run_dir / "eval" / "version-000000.jsonl")
    assert len(rows) == EVAL_PROMPTS and all(set(json.loads(r["answer"])) == {"inputs", "outputs"} for r in rows)
    rewards = [x for r in rows for x in r["rewards"]]
    # Only a program that printed every hidden output in the sandbox earns `correct`: the warm
    # start writes such programs for part of the samples, and not for all.
    reward = RewardConfig()
    assert reward.correct in rewards and reward.wrong in rewards, rewards
    assert set(rewards) <= {reward.correct, reward.wrong}
