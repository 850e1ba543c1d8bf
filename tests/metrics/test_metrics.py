"""Metrics: batch statistics, busy clocks, the JSON-lines/TensorBoard writer, the final report."""

from __future__ import annotations

import io
import json

import pytest

from areal_hpc.metrics.batch import batch_stats, source_stats, staleness_histogram
from areal_hpc.metrics.clock import BusyClock
from areal_hpc.metrics.jsonl import read_records
from areal_hpc.metrics.progress import Progress, summary_line
from areal_hpc.metrics.report import finish, summarize
from areal_hpc.metrics.writer import MetricsWriter
from areal_hpc.wire.messages import Trajectory


def traj(versions: list[int], reward: float, n_out: int = 3, finish: str = "stop", correct: bool | None = None) -> Trajectory:
    """`correct` defaults to the built-in checks' reward.correct of +5."""
    return Trajectory(0, 0, [1, 2], list(range(n_out)), [0.0] * n_out, versions, finish, reward=reward,
                      correct=reward == 5.0 if correct is None else correct)


def test_batch_stats():
    batch = [traj([3, 3, 4], 5.0), traj([4, 4, 4], -5.0), traj([2, 4, 4, 4, 4], -5.0, 5, "length")]
    assert staleness_histogram(batch, 4) == {0: 1, 1: 1, 2: 1}
    s = batch_stats(batch, version=4)
    assert s["reward_mean"] == pytest.approx(-5 / 3)
    assert s["accuracy"] == pytest.approx(1 / 3)
    assert s["trained_tokens"] == 2 + 3 + 2 + 3 + 2 + 5
    assert s["staleness_max"] == 2 and s["staleness_mean"] == 1
    assert s["truncated_fraction"] == pytest.approx(1 / 3)
    assert s["staleness_hist/2"] == 1
    with pytest.raises(ValueError):
        batch_stats([], 0)
    assert not any(k.startswith(("source/", "reward/")) for k in s)  # no sources, no custom metrics


def test_batch_stats_per_source_and_custom_metrics():
    def sample(source: str | None, reward: float, metrics: dict[str, float]) -> Trajectory:
        t = traj([4, 4, 4], reward, correct=reward in (5.0, 1.0))
        t.data_source, t.reward_metrics = source, metrics
        return t

    batch = [sample("openai/gsm8k", 5.0, {}), sample("openai/gsm8k", -5.0, {}), sample("mine", 0.0, {"len": 4.0}),
             sample("mine", 1.0, {"len": 2.0, "acc": 1.0}), sample(None, 5.0, {})]
    s = batch_stats(batch, version=4)
    assert s["source/openai/gsm8k/reward_mean"] == 0.0 and s["source/openai/gsm8k/accuracy"] == 0.5
    assert s["source/mine/reward_mean"] == 0.5 and s["source/mine/accuracy"] == 0.5
    assert not any(k.startswith("source/None") for k in s)  # a row without a source is only in the totals
    assert s["accuracy"] == 0.6
    assert s["reward/len"] == 3.0 and s["reward/acc"] == 1.0  # each over the samples that report it
    assert source_stats(batch, prefix="eval_source/")["eval_source/mine/accuracy"] == 0.5


def test_busy_clock_idle_fraction():
    c = BusyClock(now=0.0)
    c.set(True, 1.0)
    c.set(True, 2.0)  # already busy: no effect
    c.set(False, 3.0)
    assert c.idle_fraction(4.0) == pytest.approx(0.5)
    c.set(True, 5.0)
    assert c.busy_seconds(6.0) == pytest.approx(3.0)
    assert c.idle_fraction(8.0) == pytest.approx(0.25)  # busy 5..8 of 4..8


def test_tensorboard_tags_keep_only_what_tensorboard_accepts():
    from areal_hpc.metrics.writer import tensorboard_tag

    assert tensorboard_tag("eval_pass@16") == "eval_pass_16"
    assert tensorboard_tag("eval_set/aime-24/pass@2") == "eval_set/aime-24/pass_2"
    assert tensorboard_tag("train/approx_kl") == "train/approx_kl"


def test_writer_resume_drops_later_steps_and_report(tmp_path):
    w = MetricsWriter(tmp_path, tensorboard=True)
    w.write(0, {"eval_accuracy": 0.2})
    for step in (1, 2, 3):
        w.write(step, {"trained_tokens": 10.0, "reward_mean": step, "accuracy": 0.1 * step,
                       "effective_tokens_per_s": 100.0 * step, "generated_tokens_per_s": 50.0,
                       "elapsed_s": float(step), "staleness_max": 1.0, "staleness_hist/1": 4.0})
    w.close()
    assert list((tmp_path / "tensorboard").iterdir())
    w = MetricsWriter(tmp_path, tensorboard=False, resume_step=2)
    w.write(3, {"eval_accuracy": 0.5})
    records = read_records(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    s = summarize(records)
    assert s["eval_accuracy_first"] == 0.2 and s["eval_accuracy_last"] == 0.5
    assert s["effective_tokens_per_s"] == 200.0  # first step skipped
    assert s["staleness_hist/1"] == 8.0
    summary, png = finish(tmp_path, records, "test")
    assert png.stat().st_size > 1000 and (tmp_path / "summary.json").is_file()


def test_the_verdict_pairs_prompts_across_evaluations(tmp_path, capsys):
    from areal_hpc.metrics.report import finish, paired_gain, verdict

    g = paired_gain({0: 0.0, 1: 0.5, 2: 1.0, 3: 0.5}, {0: 0.5, 1: 1.0, 2: 1.0, 3: 0.5, 9: 1.0})
    assert (g.first, g.last, g.prompts) == (0.5, 0.75, 4)  # row 9 was not evaluated at the start
    # differences 0.5, 0.5, 0, 0: mean 0.25, sample std 0.2887, standard error 0.1443
    assert g.gain == 0.25 and abs(g.stderr - 0.288675 / 2) < 1e-6
    assert verdict(g).startswith("Held-out accuracy rose from 0.500 to 0.750 (+0.250 +- 0.144 s.e.")
    assert "beyond its standard error" in verdict(g)
    same = paired_gain({0: 0.0, 1: 1.0}, {0: 1.0, 1: 0.0})
    assert "within its standard error" in verdict(same)
    assert "no verdict" in verdict(paired_gain({0: 1.0}, {0: 1.0}))
    eval_dir = tmp_path / "eval"
    eval_dir.mkdir()
    (eval_dir / "version-000000.jsonl").write_text(
        json.dumps({"row": 0, "rewards": [-5, -5], "correct": [False, False]}) + "\n"
        + json.dumps({"row": 1, "rewards": [-5, 5], "correct": [False, True]}) + "\n")
    (eval_dir / "version-000020.jsonl").write_text(
        json.dumps({"row": 0, "rewards": [1, 1], "correct": [True, True]}) + "\n"  # a custom function's 0/1
        + json.dumps({"row": 1, "rewards": [5, 5], "correct": [True, True]}) + "\n")
    summary, _ = finish(tmp_path, [{"step": 1, "trained_tokens": 1.0, "reward_mean": 0.0, "staleness_max": 0.0, "elapsed_s": 1.0,
                                  "effective_tokens_per_s": 1.0, "generated_tokens_per_s": 1.0}],
                        "t")
    assert summary["eval_gain"] == 0.75
    assert "Held-out accuracy rose from 0.250 to 1.000" in capsys.readouterr().out


def test_progress_without_terminal_prints_lines():
    out = io.StringIO()
    p = Progress(total=5, stream=out)
    p.update(1, {"reward_mean": 1.5, "accuracy": 0.25})
    p.note("checkpoint saved")
    p.close()
    assert out.getvalue() == ("[rank 0 controller] step 1/5 | reward +1.50 | acc 0.25\n"
                              "[rank 0 controller] checkpoint saved\n")
    assert summary_line(2, 5, {}) == "step 2/5"


def test_a_torn_last_line_is_dropped_and_a_damaged_middle_line_named(tmp_path, caplog):
    from areal_hpc.metrics.jsonl import LogError, rewrite_records

    path = tmp_path / "ledger.jsonl"
    rewrite_records(path, [{"step": 0}, {"step": 1}])
    with path.open("a") as f:
        f.write('{"step": 2, "prom')  # the crash
    with caplog.at_level("WARNING"):
        assert read_records(path) == [{"step": 0}, {"step": 1}]
    assert "dropped its torn last line 3" in caplog.text
    path.write_text('{"step": 0}\n{"st\n{"step": 2}\n')
    with pytest.raises(LogError, match="ledger.jsonl: line 2 is not JSON"):
        read_records(path)
    # Resuming cuts the log back by a new file renamed into place.
    MetricsWriter(tmp_path, tensorboard=False).write(1, {"x": 1.0})
    MetricsWriter(tmp_path, tensorboard=False).write(2, {"x": 2.0})
    assert [r["step"] for r in read_records(tmp_path / "metrics.jsonl")] == [2]
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "x"')
    MetricsWriter(tmp_path, tensorboard=False, resume_step=2)
    assert read_records(tmp_path / "metrics.jsonl") == [{"step": 2, "x": 2.0}]
