"""A whole run on mixed data: half the prompts scored by math verification, half by a custom reward
function the test writes, routed by data_source, with per-source metrics in metrics.jsonl. On one
training prompt the function kills its reward worker, every time: the reward service fails on
those samples, which are counted and left out of training while the run goes on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mpi_jobs import run_job

from areal_hpc.data.arithmetic import make_splits

pytestmark = pytest.mark.slow

STEPS, B, GROUP = 2, 4, 2
KILLER = 1  # a custom row of the first batch
MATH, CUSTOM = "arith", "custom/echo"
# Rewards no math verdict can give (+-5), so each sample shows which reward scored it: 1.25 is
# correct (at least 1), 0.25 is not. The assert fails (a failed call, scored 0) if a math row were
# routed here.
FUNCTION = '''
import os


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    assert data_source == "custom/echo" and extra_info["row"] % 2 == 1, (data_source, extra_info)
    if extra_info.get("kills_its_worker") and solution_str != ground_truth:  # not the launch's own call
        os._exit(3)
    return {"score": 1.25 if ground_truth in solution_str else 0.25, "chars": len(solution_str)}
'''


def write_rows(path: Path, problems, killer: int | None = None) -> None:
    """Even rows math (a data source not in by_source: the default kind), odd rows custom; row
    `killer` kills the reward worker scoring it."""
    lines = []
    for i, p in enumerate(problems):
        row = {"prompt": p.prompt, "answer": p.answer, "data_source": CUSTOM if i % 2 else MATH}
        if i % 2:
            row["extra_info"] = {"row": i, "kills_its_worker": i == killer}
        lines.append(json.dumps(row) + "\n")
    path.write_text("".join(lines))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_math_and_custom_prompts_in_one_run(tmp_path: Path, tiny_model_dir: Path) -> None:
    train, held_out = make_splits(7, STEPS * B, 4)
    write_rows(tmp_path / "train.jsonl", train, killer=KILLER)
    write_rows(tmp_path / "eval.jsonl", held_out)
    (tmp_path / "echo_reward.py").write_text(FUNCTION)
    run_dir = tmp_path / "run"
    job = run_job(3, [
        f"logging.dir={run_dir}", f"model.path={tiny_model_dir}", f"total_steps={STEPS}",
        # eta 0 and no shuffle: each batch is rows 4k..4k+3, two prompts of each source
        "rollout.eta=0", f"rollout.batch_prompts={B}", f"rollout.group_size={GROUP}", "rollout.max_concurrent=4",
        "rollout.max_new_tokens=64", "data.shuffle=false", f"data.train_path={tmp_path / 'train.jsonl'}",
        f"data.eval_path={tmp_path / 'eval.jsonl'}", f"reward.by_source={{{CUSTOM}: custom}}",
        f"reward.function={tmp_path / 'echo_reward.py'}:compute_score", "checkpoint.interval_steps=0",
        "logging.tensorboard=false",
    ], timeout=480)
    assert job.returncode == 0, job.output[-5000:]
    records = read_jsonl(run_dir / "metrics.jsonl")
    steps = [r for r in records if "trained_tokens" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # Both samples of row 1 failed in the reward service: counted, left out, named once.
    assert [r["reward_infra_failures"] for r in steps] == [GROUP, 0]
    trained = [sum(v for k, v in r.items() if k.startswith("staleness_hist/")) for r in steps]
    assert trained == [B * GROUP - GROUP, B * GROUP]
    ledger = read_jsonl(run_dir / "ledger.jsonl")
    assert [e["prompt_ids"] for e in ledger] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # the prompt is not retried
    assert "sample(s) left out of training, the reward service failed on them: custom reward function" in job.output
    assert ": the reward worker died under this task" in job.output
    for r in steps:
        assert r["source/arith/reward_mean"] % 2.5 == 0 and -5 <= r["source/arith/reward_mean"] <= 5, r
        assert 0.25 <= r["source/custom/echo/reward_mean"] <= 1.25, r
        assert {"source/arith/accuracy", "source/custom/echo/accuracy", "reward/chars"} <= r.keys()
        # Each source's accuracy on its own scale: the share of +5 among +-5, of 1.25 among 0.25/1.25.
        assert r["source/arith/accuracy"] == pytest.approx((r["source/arith/reward_mean"] + 5) / 10), r
        assert r["source/custom/echo/accuracy"] == pytest.approx(r["source/custom/echo/reward_mean"] - 0.25), r
    evals = [r for r in records if "eval_accuracy" in r]
    assert [e["step"] for e in evals] == [0, STEPS]
    assert all({"eval_source/arith/accuracy", "eval_source/custom/echo/accuracy"} <= e.keys() for e in evals)
    for row in read_jsonl(run_dir / "eval" / f"version-{STEPS:06d}.jsonl"):
        allowed = {0.25, 1.25} if row["row"] % 2 else {-5.0, 5.0}
        assert set(row["rewards"]) <= allowed, row
