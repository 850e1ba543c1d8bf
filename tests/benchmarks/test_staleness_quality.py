"""benchmarks/staleness_quality.py without running a job: its argument handling (the grid each
flag asks for, refusals with exit 2 before anything runs), a run's values from metrics records,
the Table 2 / Table 1 arithmetic and verdict on constructed runs, reuse and the report file."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from bench_scripts import loaded

SCRIPT = Path("benchmarks/staleness_quality.py")


@pytest.fixture(scope="module")
def sq():
    with loaded("staleness_quality") as module:
        yield module


def settings(sq, *argv: str):
    return sq.resolve(sq.build_parser().parse_args(list(argv)), 3e-4, 2)


# ---- arguments --------------------------------------------------------------------------------


def test_etas_parse_with_inf_sorted_last(sq):
    assert sq.parse_etas("4,0,inf,1") == (0, 1, 4, None)
    for bad in ("4,8", "0,-1", "0,4,4", "0,x"):
        with pytest.raises(Exception, match="eta"):
            sq.parse_etas(bad)


def test_full_grid_is_39_runs_and_quick_a_subset(sq):
    full, quick = settings(sq), settings(sq, "--quick")
    assert len(sq.grid(full)) == 3 * (1 + 6 * 2) == 39
    assert len(sq.grid(quick)) == 2 * (1 + 2 * 2) == 10
    assert set(quick.etas) < set(full.etas) and quick.steps < full.steps
    runs = sq.grid(full)
    assert [r for r in runs if r[1] == 0] == [(s, 0, "standard") for s in range(3)]
    assert runs[:13] == [r for r in runs if r[0] == 0], "a partial grid is whole seeds"


def test_flags_override_quick_and_defaults_come_from_the_config(sq):
    s = settings(sq, "--quick", "--steps", "2", "--seeds", "1", "--etas", "0,4", "--objectives", "decoupled",
                 "--minibatches", "4")
    assert (s.steps, s.seeds, s.etas, s.objectives, s.minibatches, s.lr) == (2, 1, (0, 4), ("decoupled",), 4, 3e-4)
    assert s.eval_prompts == sq.QUICK["eval_prompts"]
    assert [(e, o) for _, e, o in sq.grid(s)] == [(0, "standard"), (4, "decoupled")]
    assert settings(sq, "--lr", "1e-3").key != settings(sq).key


def test_overrides_let_each_eta_be_reached(sq):
    s = settings(sq, "--etas", "0,4,inf")
    by_key = {o.split("=", 1)[0]: o.split("=", 1)[1] for o in sq.overrides(s, Path("m"), 2, None, "decoupled")}
    assert by_key["rollout.eta"] == str(s.steps), "unbounded is eta = steps"
    assert by_key["rollout.max_concurrent"] == str(s.batch_prompts * (s.steps + 1))
    assert (by_key["seed"], by_key["ppo.decoupled"], by_key["model.path"]) == ("2", "true", "m")
    sync = dict(o.split("=", 1) for o in sq.overrides(s, Path("m"), 1, 0, "standard"))
    assert (sync["rollout.max_concurrent"], sync["ppo.decoupled"]) == (str(s.batch_prompts), "false")


@pytest.mark.parametrize("argv, message", [
    (["--etas", "1,4"], "must include 0"),
    (["--eval-prompts", "500"], "at most 128"),
    (["--objectives", "grpo"], "choose from"),
    (["--seeds", "0"], ">= 1"),
    (["--lr", "-1"], "optimizer.lr = -1.0: must be > 0"),
    (["--minibatches", "500"], "ppo.minibatches = 500"),
])
def test_bad_arguments_exit_2_before_any_run(argv, message, tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), *argv, "--work-dir", str(tmp_path / "w"),
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert not (tmp_path / "w").exists() and not (tmp_path / "o").exists()


# ---- one run's values -------------------------------------------------------------------------


def records(accuracies: dict[int, float], steps: int, kl: float, staleness: float, step_s: float = 2.0) -> list[dict]:
    """Metrics records as the controller writes them: eval rounds keyed by version, step records."""
    out = []
    for v in range(steps + 1):
        if v in accuracies:
            out.append({"step": v, "eval_accuracy": accuracies[v], "eval_pass@1": accuracies[v],
                        "eval_pass@8": min(1.0, 2 * accuracies[v])})
        if v < steps:
            out.append({"step": v + 1, "trained_tokens": 100.0, "reward_mean": 0.1 * v, "elapsed_s": step_s * (v + 1),
                        "staleness_mean": staleness, "staleness_max": 2 * staleness, "train/approx_kl": kl,
                        "train/importance_weight_max": 1.5, "train/masked_fraction": 0.0, "train/clip_fraction": 0.01})
    return out


def prompts(acc: float, n: int = 8) -> dict[int, float]:
    """Per-prompt accuracies with mean `acc` and some spread (so paired errors are not zero)."""
    return {r: acc + (0.05 if r % 2 else -0.05) * (1 + r / n) for r in range(n)}


def test_summarize_run_reads_curve_drift_and_paired_gain(sq):
    recs = records({0: 0.2, 2: 0.25, 4: 0.3}, 4, kl=1e-3, staleness=1.5)
    first, last = prompts(0.2), prompts(0.3)
    last[0] += 0.1
    r = sq.summarize_run(recs, [first, prompts(0.25), last])
    assert (r["first"], r["final"], r["final_pass_at_n"], r["pass_n"]) == (0.2, 0.3, 0.6, 8)
    assert [(p["version"], p["elapsed_s"]) for p in r["curve"]] == [(0, 0.0), (2, 4.0), (4, 8.0)]
    assert (r["wall_s"], r["approx_kl"], r["staleness_mean"], r["staleness_max"]) == (8.0, 1e-3, 1.5, 3.0)
    assert r["gain"] == pytest.approx(sum(last.values()) / 8 - sum(first.values()) / 8)
    assert r["gain_se"] > 0
    assert r["final_per_prompt"]["0"] == last[0]
    with pytest.raises(ValueError, match="two held-out rounds"):
        sq.summarize_run(records({0: 0.2}, 4, 1e-3, 1.0), [first])


# ---- the tables -------------------------------------------------------------------------------


def run(sq, seed: int, eta: str, objective: str, final: float, step_s: float = 2.0, kl: float = 1e-3) -> dict:
    mid = (0.2 + final) / 2
    r = sq.summarize_run(records({0: 0.2, 2: mid, 4: final}, 4, kl, staleness=0.0 if eta == "0" else 2.0,
                                 step_s=step_s), [prompts(0.2), prompts(mid), prompts(final + 0.01 * seed)])
    return {"seed": seed, "eta": eta, "objective": objective, **r}


def grid_runs(sq, hurt: bool) -> list[dict]:
    """eta 0 at 0.30, eta 4 decoupled at ~0.31 (faster: 1 s steps), standard PPO at 0.20 if hurt."""
    out = []
    for seed, noise in ((1, 0.0), (2, 0.01), (3, -0.01)):
        out += [run(sq, seed, "0", "standard", 0.30 + noise),
                run(sq, seed, "4", "decoupled", 0.31 + noise, step_s=1.0, kl=2e-3),
                run(sq, seed, "4", "standard", (0.20 if hurt else 0.30) + noise * 1.5, step_s=1.0, kl=5e-3)]
    return out


def test_table2_pairs_by_seed_and_eta0_starts_both_lines(sq):
    rows = sq.table2(grid_runs(sq, hurt=True), ["0", "4"])
    assert rows[0]["standard"]["accuracy"] == rows[0]["decoupled"]["accuracy"] == pytest.approx(0.30)
    std = rows[1]["standard"]
    assert std["accuracy"] == pytest.approx(0.20) and std["seeds"] == 3
    d = std["vs_eta0"]
    assert d["over"] == "seeds" and d["diff"] == pytest.approx(-0.10)
    diffs = [0.0, 0.005, -0.005]  # standard's seed noise is 1.5x eta 0's
    assert d["se"] == pytest.approx(math.sqrt(sum(x * x for x in diffs) / 2) / math.sqrt(3))
    assert rows[1]["decoupled_minus_standard"]["diff"] == pytest.approx(0.11)
    assert std["approx_kl"] == pytest.approx(5e-3) and std["staleness_mean"] == 2.0
    assert sq.drift(grid_runs(sq, hurt=True)) == pytest.approx(1e-3)


def test_one_seed_falls_back_to_prompt_paired_error(sq):
    runs = [r for r in grid_runs(sq, hurt=True) if r["seed"] == 1]
    d = sq.table2(runs, ["0", "4"])[1]["standard"]["vs_eta0"]
    assert d["over"] == "prompts" and d["n"] == 8 and d["se"] > 0
    assert d["diff"] == pytest.approx(-0.10)


def test_verdict_names_the_hurt_eta_and_whether_decoupled_kept_it(sq):
    hurt = sq.verdict(sq.table2(grid_runs(sq, hurt=True), ["0", "4"]))
    assert len(hurt) == 1 and hurt[0].startswith("eta 4: standard PPO -0.100")
    assert "kept within 2 standard errors" in hurt[0]
    fine = sq.verdict(sq.table2(grid_runs(sq, hurt=False), ["0", "4"]))
    assert fine[0].startswith("At no eta did standard PPO")


def test_time_to_reach_interpolates_between_evaluations(sq):
    curve = [{"accuracy": 0.2, "elapsed_s": 0.0}, {"accuracy": 0.3, "elapsed_s": 10.0}, {"accuracy": 0.4, "elapsed_s": 20.0}]
    assert sq.time_to_reach(curve, 0.35) == pytest.approx(15.0)
    assert sq.time_to_reach(curve, 0.1) == 0.0
    assert sq.time_to_reach(curve, 0.5) is None


def test_table1_compares_eta0_with_the_best_decoupled_eta(sq):
    runs = grid_runs(sq, hurt=True) + [run(sq, s, "8", "decoupled", 0.25, step_s=1.0) for s in (1, 2, 3)]
    t1 = sq.table1(runs, ["0", "4", "8"])
    assert (t1["objective"], t1["best_eta"]) == ("decoupled", "4")
    assert t1["sync"]["wall_s"] == 8.0 and t1["async"]["wall_s"] == 4.0
    assert t1["same_steps_wall_ratio"] == pytest.approx(2.0)
    assert t1["sync_time_to_target_s"] == pytest.approx(8.0)
    # async's mean curve 0.2 -> 0.255 -> 0.31 at 0, 2, 4 s reaches 0.30 at 2 + 2 * 0.045 / 0.055 s
    assert t1["async_time_to_target_s"] == pytest.approx(2 + 2 * 0.045 / 0.055)
    assert t1["time_to_target_ratio"] == pytest.approx(8.0 / (2 + 2 * 0.045 / 0.055))
    assert t1["vs_sync"]["diff"] == pytest.approx(0.01)


# ---- reuse and the report ---------------------------------------------------------------------


def test_a_finished_run_is_reused_only_with_the_same_overrides(sq, tmp_path):
    (tmp_path / sq.RESULT_FILE).write_text(json.dumps({"overrides": ["a=1"], "result": {"final": 0.3}}))
    assert sq.reusable(tmp_path, ["a=1"]) == {"final": 0.3}
    assert sq.reusable(tmp_path, ["a=2"]) is None
    assert sq.reusable(tmp_path / "missing", ["a=1"]) is None


def test_report_keeps_one_entry_per_setting_and_plots_them(sq, tmp_path):
    s, other = settings(sq, "--etas", "0,4"), settings(sq, "--etas", "0,4", "--lr", "1e-3")
    a = sq.report_entry(s, grid_runs(sq, hurt=True), "cmd a")
    b = sq.report_entry(other, grid_runs(sq, hurt=False), "cmd b")
    report = sq.merge(sq.merge(None, a), b)
    report = sq.merge(json.loads(json.dumps(report)), {**a, "command": "cmd a again"})
    assert [(e["key"], e["command"]) for e in report["settings"]] == [(other.key, "cmd b"), (s.key, "cmd a again")]
    assert a["start"]["accuracy"] == pytest.approx(0.2) and a["drift_kl"] == pytest.approx(1e-3)
    text = sq.tables(a)
    assert "before RL 0.200 +- 0.000" in text
    assert "| 4 | 0.200 +- " in text and "23.3 / 42.2" in text and "wall-clock ratio" in text
    sq.plot(report, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 10_000
