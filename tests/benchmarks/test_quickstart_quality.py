"""benchmarks/quickstart_quality.py without running a job: the report it builds from a run's
metrics records and summary, its target check, table and plot."""

from __future__ import annotations

import pytest
from bench_scripts import loaded


@pytest.fixture(scope="module")
def qq():
    with loaded("quickstart_quality") as module:
        yield module


def records(evals: dict[int, float], rewards: list[float]) -> list[dict]:
    out = [{"step": v, "eval_accuracy": a, "eval_pass@1": a, "eval_pass@16": min(1.0, 2 * a)}
           for v, a in evals.items() if v == 0]
    for step, r in enumerate(rewards, 1):
        out.append({"step": step, "trained_tokens": 100.0, "reward_mean": r})
        if step in evals:
            out.append({"step": step, "eval_accuracy": evals[step], "eval_pass@1": evals[step],
                        "eval_pass@16": min(1.0, 2 * evals[step])})
    return out


def test_moving_average(qq) -> None:
    assert qq.moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert qq.moving_average([2.0], 10) == [2.0]


@pytest.mark.parametrize("gain, minutes, met", [(0.25, 7.5, True), (0.15, 7.5, False), (0.25, 8.5, False)])
def test_the_report_and_its_target(qq, gain, minutes, met, tmp_path) -> None:
    recs = records({0: 0.3, 2: 0.4, 4: 0.3 + gain}, [-1.0, 0.0, 1.0, 2.0])
    summary = {"eval_accuracy_first": 0.3, "eval_accuracy_last": 0.3 + gain, "eval_gain": gain, "eval_gain_stderr": 0.02}
    report = qq.summarize(recs, summary, warm_start_s=120.0, run_s=minutes * 60 - 120.0, name="quickstart")
    assert [h["version"] for h in report["held_out"]] == [0, 2, 4]
    assert [h["eval_pass@16"] for h in report["held_out"]] == [0.6, 0.8, min(1.0, 2 * (0.3 + gain))]
    assert report["reward_smoothed"][-1] == pytest.approx(0.5)  # the mean of all four (window 10)
    assert report["total_min"] == pytest.approx(minutes)
    assert report["meets_target"] is met
    text = qq.table(report)
    assert ("target (gain >= 0.2, <= 8 min) met" in text) is met
    assert f"gain {gain:+.3f} +- 0.020 s.e." in text
    qq.plot(report, tmp_path / "q.png")
    assert (tmp_path / "q.png").stat().st_size > 0
