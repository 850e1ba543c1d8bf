"""benchmarks/faults.py without running a job: the recovery figures from the three jobs' step
records, the ledger check, the table and the plot."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_scripts import loaded

from areal_hpc.config.load import load_config


@pytest.fixture(scope="module")
def bf():
    with loaded("faults") as module:
        yield module


def record(version: int, wall: float, step_s: float = 2.0, tokens: float = 1000.0) -> dict:
    return {"version": float(version), "wall_time": wall, "step_s": step_s, "trained_tokens": tokens}


def jobs():
    """Clean: 12 steps of 2 s from t = 100. Killed: started at t = 0, steps 1-6 every 2 s from
    t = 20, killed after step 6 (t = 30), ended at t = 33. Resumed from the version-4 checkpoint:
    steps 5-12 every 2 s from t = 60."""
    clean = [record(v, 100 + 2 * v) for v in range(1, 13)]
    killed = [record(v, 18 + 2 * v) for v in range(1, 7)]
    resumed = [record(v, 60 + 2 * (v - 5)) for v in range(5, 13)]
    return clean, killed, resumed


def test_recovery_figures_from_the_step_records(bf):
    clean, killed, resumed = jobs()
    f = bf.figures(clean, killed, resumed, 6, killed_started=0.0, killed_ended=33.0)
    assert f["detection_s"] == pytest.approx(3.0)
    assert f["recovery_s"] == pytest.approx(64.0 - 30.0)  # version 7 at t = 64
    assert f["recovery_steps"] == pytest.approx(34.0 / 2.0)
    assert f["steps_lost"] == 2.0 and f["steps_after_kill"] == 0.0
    assert f["clean_tokens_per_s"] == pytest.approx(500.0)
    assert f["before_tokens_per_s"] == f["after_tokens_per_s"] == pytest.approx(500.0)
    # Useful work: 4 steps kept from the killed job and 8 of the resumed, over 74 s from its start.
    assert f["whole_tokens_per_s"] == pytest.approx(12 * 1000.0 / 74.0)


def test_a_step_the_killed_job_finished_after_the_kill_is_lost_too(bf):
    clean, killed, resumed = jobs()
    f = bf.figures(clean, [*killed, record(7, 32.0)], resumed, 6, killed_started=0.0, killed_ended=33.0)
    assert f["steps_lost"] == 3.0 and f["steps_after_kill"] == 1.0


def test_a_fault_that_fired_before_its_version_is_named(bf):
    clean, killed, resumed = jobs()
    with pytest.raises(ValueError, match="never 6: the fault fired elsewhere"):
        bf.figures(clean, killed[:3], resumed, 6, killed_started=0.0, killed_ended=33.0)


def test_the_ledger_check_finds_lost_and_repeated_prompts(bf):
    good = [{"step": s, "prompt_ids": [2 * s, 2 * s + 1]} for s in range(3)]
    assert bf.ledger_problems(good, 3, 2) == []
    twice = [*good[:2], {"step": 2, "prompt_ids": [3, 4]}]
    assert bf.ledger_problems(twice, 3, 2) == ["1 prompts trained twice"]
    assert "did not train 2 prompts" in bf.ledger_problems([*good[:2], {"step": 2, "prompt_ids": [9]}], 3, 2)[0]
    assert "not 0..2 once each" in bf.ledger_problems(good[:2], 3, 2)[0]


def test_the_runs_are_a_valid_config_with_two_generators(bf):
    cfg = load_config(bf.CONFIG, bf.overrides(bf.STEPS, bf.INTERVAL, Path("model")), check_files=False)
    assert cfg.generator.count == 2 and cfg.checkpoint.interval_steps == bf.INTERVAL
    assert bf.KILL_AT % bf.INTERVAL != 0, "the kill must fall past a checkpoint, so lost steps show"


def test_table_and_plot(bf, tmp_path):
    clean, killed, resumed = jobs()
    report = {"figures": bf.figures(clean, killed, resumed, 6, 0.0, 33.0), "ledger_problems": [],
              "killed_started": 0.0, "clean_startup_s": 10.0, "kill_at": 6, "clean_steps": clean,
              "killed_steps": killed, "resumed_steps": resumed}
    text = bf.table(report)
    assert "| steps lost (trained again after the requeue) | 2 | 0 |" in text
    assert "ledger: every prompt trained exactly once" in text
    bf.plot(report, tmp_path / "faults.png")
    assert (tmp_path / "faults.png").stat().st_size > 5000
