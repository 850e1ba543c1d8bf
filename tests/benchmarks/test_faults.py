"""benchmarks/faults.py without running a job: the recovery figures from the two jobs' step
records, the ledger check, the table and the plot."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from bench_scripts import loaded

from areal_hpc.config.load import load_config


@pytest.fixture(scope="module")
def bf():
    with loaded("faults") as module:
        yield module


def record(version: int, wall: float, alive: int = 2, step_s: float = 2.0, tokens: float = 1000.0) -> dict:
    return {"version": float(version), "wall_time": wall, "step_s": step_s, "trained_tokens": tokens,
            "generators_alive": float(alive)}


def jobs():
    """Clean: 12 steps of 2 s from t = 100. Killed: steps 1-4 every 2 s from t = 20 (killed as
    version 4's update starts, t = 26), then steps 5-12 with one generator, every 3 s from t = 31."""
    clean = [record(v, 100 + 2 * v) for v in range(1, 13)]
    killed = [record(v, 20 + 2 * (v - 1)) for v in range(1, 5)]
    killed += [record(v, 31 + 3 * (v - 5), alive=1, step_s=3.0) for v in range(5, 13)]
    return clean, killed


def test_recovery_figures_from_the_step_records(bf):
    clean, killed = jobs()
    f = bf.figures(clean, killed, 4, loss_seen=26.5, steps=12)
    assert f["detection_s"] == pytest.approx(0.5)
    assert f["recovery_s"] == pytest.approx(31.0 - 26.0)  # version 5 at t = 31, the kill at 26
    assert f["recovery_steps"] == pytest.approx(5.0 / 2.0)
    assert f["steps_lost"] == 0.0 and f["generators_after"] == 1.0
    assert f["clean_tokens_per_s"] == f["before_tokens_per_s"] == pytest.approx(500.0)
    assert f["after_tokens_per_s"] == pytest.approx(1000.0 / 3.0)


def test_steps_trained_twice_or_never_are_lost(bf):
    clean, killed = jobs()
    assert bf.figures(clean, [*killed, record(12, 60.0, alive=1)], 4, 28.5, 12)["steps_lost"] == 1.0
    assert bf.figures(clean, killed[:-2], 4, 28.5, 12)["steps_lost"] == 2.0


def test_a_fault_that_fired_elsewhere_or_a_run_that_never_lost_it_is_named(bf):
    clean, killed = jobs()
    with pytest.raises(ValueError, match="never 4: the fault fired elsewhere"):
        bf.figures(clean, killed[:3], 4, 28.5, 12)
    with pytest.raises(ValueError, match="generators_alive never dropped"):
        bf.figures(clean, killed[:4], 4, 28.5, 12)


def test_rank_0s_log_time_is_the_unix_time_of_the_line(bf):
    line = "2026-12-02 06:52:03,220 [rank 0 controller] areal_hpc.runtime.controller_rank: rank 3 ..."
    assert bf.log_time(line) == pytest.approx(datetime.datetime(2026, 12, 2, 6, 52, 3, 220000).timestamp())


def test_the_ledger_check_finds_lost_and_repeated_prompts(bf):
    good = [{"step": s, "prompt_ids": [2 * s, 2 * s + 1]} for s in range(3)]
    assert bf.ledger_problems(good, 3, 2) == []
    twice = [*good[:2], {"step": 2, "prompt_ids": [3, 4]}]
    assert bf.ledger_problems(twice, 3, 2) == ["1 prompts trained twice"]
    assert "did not train 2 prompts" in bf.ledger_problems([*good[:2], {"step": 2, "prompt_ids": [9]}], 3, 2)[0]
    assert "not 0..2 once each" in bf.ledger_problems(good[:2], 3, 2)[0]


def test_the_runs_are_a_valid_config_with_two_generators(bf):
    cfg = load_config(bf.CONFIG, bf.overrides(bf.STEPS, Path("model")), check_files=False)
    assert cfg.generator.count == 2 and cfg.world_size == 4


def test_table_and_plot(bf, tmp_path):
    clean, killed = jobs()
    report = {"figures": bf.figures(clean, killed, 4, 28.5, 12), "ledger_problems": [], "kill_at": 4,
              "clean_steps": clean, "killed_steps": killed}
    text = bf.table(report)
    assert "| steps lost (trained twice or never) | 0 | 0 |" in text
    assert "ledger: every prompt trained exactly once" in text
    bf.plot(report, tmp_path / "faults.png")
    assert (tmp_path / "faults.png").stat().st_size > 5000
