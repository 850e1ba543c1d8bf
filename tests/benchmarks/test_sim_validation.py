"""benchmarks/sim_validation.py without running a job: each variant's config and layout, the
measured figures from step records, the prediction from a calibration, the errors, their median
and worst with the reference apart, the goal verdict, the table and the plot."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_scripts import loaded

from areal_hpc.config.load import load_config
from areal_hpc.sim.calibration import Calibration, Fitted
from areal_hpc.sim.run import Run
from areal_hpc.sim.run_fit import MeasuredRun


@pytest.fixture(scope="module")
def sv():
    with loaded("sim_validation") as module:
        yield module


def config(sv, name: str, steps: int = 12):
    return load_config(sv.CONFIG, sv.overrides(sv.BY_NAME[name], steps, Path("model"), Path("run")), check_files=False)


def calibration() -> Calibration:
    """Parameters of the order the tiny CPU miniature measures."""
    f = lambda v: Fitted(v, 10, 0.05)  # noqa: E731
    return Calibration(hardware="cpu", runs=("reference",), decode_efficiency=f(0.08), step_overhead_s=f(0.002),
                       prefill_mfu=f(0.07), train_mfu=f(0.18), update_overhead_s=f(0.15), reward_s=f(0.003),
                       prompt_len=f(17.0), length_median=f(450.0), length_sigma=f(1.8), length_prompt_share=f(0.0))


def test_each_variant_changes_one_setting_and_its_world(sv):
    ref = config(sv, "reference")
    assert (ref.rollout.eta, ref.generator.count, ref.trainer.tp, ref.trainer.pp) == (4, 1, 1, 1)
    expected = {"eta0": (0, 1, 1, 1, 3), "eta8": (8, 1, 1, 1, 3), "gen3": (4, 3, 1, 1, 5), "tp2": (4, 1, 2, 1, 4),
                "pp2": (4, 1, 1, 2, 4)}
    for name, (eta, gens, tp, pp, world) in expected.items():
        cfg = config(sv, name)
        assert (cfg.rollout.eta, cfg.generator.count, cfg.trainer.tp, cfg.trainer.pp, cfg.world_size) == (
            eta, gens, tp, pp, world), name
        assert cfg.rollout.max_concurrent == ref.rollout.max_concurrent and cfg.total_steps == 12
    layout = sv.layout_of(config(sv, "gen3"))
    assert (layout.engines, layout.gen_gpus, layout.train_gpus, layout.gpus) == (3, 3, 1, 4)
    assert sv.parse_runs("gen2, reference") == ("gen2", "reference")
    for bad in ("gen2", "reference,gen9"):
        with pytest.raises(Exception, match="--runs"):
            sv.parse_runs(bad)


def records(step_s: list[float], tokens: float, trainer_idle: list[float], gen_idle: list[float],
            in_flight: list[tuple[int, int]] | None = None) -> list[dict]:
    """Step records as the controller writes them; `in_flight`: (complete groups, prompts in
    flight) at each step's end, by default none (the run never drains before its last step)."""
    in_flight = in_flight or [(0, 0)] * len(step_s)
    return [{"step": i + 1, "step_s": s, "trained_tokens": tokens, "trainer_idle_fraction": t,
             "generator_idle_fraction": g, "buffer_groups": b, "running_prompts": r}
            for i, (s, t, g, (b, r)) in enumerate(zip(step_s, trainer_idle, gen_idle, in_flight, strict=True))]


def test_measured_figures_pool_the_steps_of_the_window(sv):
    # The 10 s first step and the last are left out; idle fractions are weighted by step seconds.
    steps = records([10.0, 1.0, 3.0, 0.1], 600.0, [0.9, 0.5, 0.1, 0.0], [0.0, 0.2, 0.6, 1.0])
    m = sv.measured_figures(steps, 1, 3)
    assert m["tokens_per_s"] == pytest.approx(1200 / 4) and m["step_s"] == pytest.approx(2.0)
    assert m["trainer_idle"] == pytest.approx((0.5 * 1 + 0.1 * 3) / 4)
    assert m["generator_idle"] == pytest.approx((0.2 * 1 + 0.6 * 3) / 4)
    assert m["trainer_busy_s"] == pytest.approx((1 - 0.2) * 2.0) and m["tokens_per_step"] == 600.0
    with pytest.raises(ValueError, match="leave none"):
        sv.measured_figures(steps, 3, 3)


def test_the_drain_ends_the_window_once_every_prompt_of_the_run_is_in(sv):
    """10 steps of 8 prompts: 80 in all. After step 6, 48 trained + 24 complete + 8 in flight = 80:
    from then on the generators run dry and steps 7-10 are the drain."""
    in_flight = [(24, 8), (16, 16), (16, 16), (8, 24), (16, 16), (24, 8), (16, 8), (8, 8), (8, 0), (0, 0)]
    steps = records([1.0] * 10, 600.0, [0.0] * 10, [0.1] * 10, in_flight)
    assert sv.steady_end(steps, 8) == 6
    # Synchronous: nothing complete or in flight at a step's end; only the last step has them all.
    assert sv.steady_end(records([1.0] * 10, 600.0, [0.5] * 10, [0.5] * 10, [(0, 0)] * 10), 8) == 10
    run = Run(step_ends=tuple(float(i) for i in range(1, 13)), step_tokens=(1,) * 12, warmup=4, gen_busy_gpu_s=1.0,
              train_busy_gpu_s=1.0, gen_gpus=1, train_gpus=1, colocated=False, max_staleness=0)
    assert sv.window_start(run, 30) == 4 and sv.window_start(run, 6) == 3
    assert sv.window_start(Run(**{**run.__dict__, "warmup": 0}), 30) == 1


def test_errors_are_relative_for_rates_and_in_points_for_idle_shares(sv):
    measured = {"tokens_per_s": 1000.0, "step_s": 2.0, "trainer_idle": 0.0, "generator_idle": 0.5}
    predicted = {"tokens_per_s": 1100.0, "step_s": 1.5, "trainer_idle": 0.1, "generator_idle": 0.3}
    assert sv.errors(predicted, measured) == pytest.approx(
        {"tokens_per_s": 0.1, "step_s": -0.25, "trainer_idle": 0.1, "generator_idle": -0.2})


def row(name: str, errs: list[float], reference: bool = False) -> dict:
    keys = ("tokens_per_s", "step_s", "trainer_idle", "generator_idle")
    figures = dict.fromkeys(keys, 1.0) | {"tokens_per_step": 1.0, "trainer_busy_s": 1.0, "steps": 5}
    return {"name": name, "label": name, "reference": reference, "window": [1, 5], "gpus": 2, "cores": 2,
            "measured": figures, "predicted": figures, "errors": dict(zip(keys, errs, strict=True)), "job_s": None}


def test_summary_leaves_the_reference_out_and_judges_the_goal(sv):
    rows = [row("reference", [0.9, 0.9, 0.9, 0.9], reference=True), row("a", [0.05, -0.10, 0.02, 0.12]),
            row("b", [0.20, -0.25, 0.0, -0.01])]
    s = sv.summarize(rows)
    assert s["per_quantity"]["step_s"] == {"median": pytest.approx(0.175), "worst": 0.25, "n": 2}
    assert s["pooled"]["median"] == pytest.approx((0.05 + 0.10) / 2) and s["pooled"]["worst"] == 0.25
    assert s["worst"] == {"run": "b", "quantity": "step_s", "error": -0.25}
    assert s["reference"]["worst"] == 0.9 and s["goal"]["met"]
    s = sv.summarize([*rows, row("c", [0.31, 0.0, 0.0, 0.0])])
    assert not s["goal"]["met"] and s["worst"]["run"] == "c"
    assert not sv.summarize(rows[:1])["goal"]["met"]  # nothing predicted blind: no verdict of success


def test_prediction_is_the_runs_layout_over_its_steps_and_compares_with_its_records(sv):
    """A run measured exactly as the simulator predicts it has no error; the simulator sees the
    variant: 2 generators raise the throughput of this generation-bound setting, eta 0 lowers it."""
    cal = calibration()
    ref = sv.predict_run(config(sv, "reference", 30), cal, 30)
    assert len(ref.run.step_ends) == 30 and ref.workload.prompt_len == 17
    assert ref.workload.lengths.cap == 256 and ref.workload.max_concurrent == 32
    rates = {name: sv.predict_run(config(sv, name, 30), cal, 30).run.tokens_per_s for name in ("eta0", "gen2")}
    assert rates["eta0"] < ref.run.tokens_per_s < rates["gen2"]
    p = sv.predicted_figures(ref.run)
    start = sv.window_start(ref.run, 30)
    exact = records([p["step_s"]] * 30, p["tokens_per_step"], [p["trainer_idle"]] * 30, [p["generator_idle"]] * 30)
    result = sv.compare(sv.REFERENCE, MeasuredRun("reference", config(sv, "reference", 30), tuple(exact)), cal, cores=2)
    assert result["window"] == [start, 30] and result["measured"]["steps"] == 30 - start
    assert all(abs(e) < 1e-9 for e in result["errors"].values()), result["errors"]
    assert result["gpus"] == 2 and result["reference"]


def test_table_and_plot(sv, tmp_path):
    rows = [row("reference", [0.01, 0.02, 0.0, 0.01], reference=True), row("gen3", [0.4, -0.3, 0.05, -0.2])]
    report = {"runs": rows, "summary": sv.summarize(rows)}
    text = sv.table(report)
    assert "| reference (fit) |" in text and "| gen3 |" in text and "NOT met" in text and "(+40%)" in text
    sv.plot(report, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 10_000
