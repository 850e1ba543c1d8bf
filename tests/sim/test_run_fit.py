"""`areal-hpc sim fit`: the fit recovers known parameters from synthetic records, the engines'
step-time sums, the calibration file's round trip and its malformed forms (exit 2 naming the
key); the fit on a real run is in tests/runtime/test_e2e.py, on its run directory."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml

from areal_hpc.cli import main
from areal_hpc.config.load import load_config
from areal_hpc.metrics.batch import cost_stats
from areal_hpc.rollout.engine_stats import EngineStats, bucket_of
from areal_hpc.sim import predict
from areal_hpc.sim.calibration import Calibration
from areal_hpc.sim.commands import read_calibration, write_calibration
from areal_hpc.sim.cost_model import Efficiency, pipeline_stretch
from areal_hpc.sim.hardware import CPU
from areal_hpc.sim.lengths import LengthDistribution
from areal_hpc.sim.run_fit import MeasuredRun, fit_runs
from areal_hpc.wire.messages import Trajectory

TRUE = Efficiency(decode=0.02, step_overhead_s=0.004, mfu=0.15, prefill_mfu=0.05, update_overhead_s=0.12)
LENGTHS = LengthDistribution(median=40.0, sigma=0.6, cap=10**6, prompt_share=0.4)
REWARD_S = 0.003
PROMPT = 30


@pytest.fixture(autouse=True)
def fast(monkeypatch):
    monkeypatch.setattr(predict, "QUICK", predict.Fidelity(steps=1, sync_steps=1))


def synthetic_run(steps: int = 12, noise: float = 0.02, seed: int = 0) -> MeasuredRun:
    """Records as the controller writes them, from TRUE and LENGTHS, each time off by up to +-noise."""
    cfg = load_config("configs/experiments/tiny-cpu.yaml", check_files=False)
    rng = np.random.default_rng(seed)
    run = MeasuredRun("synthetic", cfg, ())
    cost = run.cost(CPU, TRUE)
    r = cfg.rollout
    records = []
    for step in range(1, steps + 1):
        lengths = LENGTHS.sample(rng, r.batch_prompts, r.group_size)
        logs = np.log(lengths)
        tokens = float((lengths + PROMPT).sum())
        rec = {
            "step": step, "trained_tokens": tokens, "trained_tokens_sq": float(((lengths + PROMPT) ** 2).sum()),
            "response_len_mean": float(lengths.mean()), "reward_s_mean": REWARD_S * (1 + noise * rng.uniform(-1, 1)),
            "response_len_log_mean": float(logs.mean()), "response_len_log_std": float(logs.std()),
            "response_len_log_within_std": float(np.sqrt(((logs - logs.mean(1, keepdims=True)) ** 2).sum()
                                                         / (logs.size - r.batch_prompts))),
        }
        context = PROMPT + lengths.mean() / 2
        jitter = lambda: 1 + noise * rng.uniform(-1, 1)  # noqa: E731
        rec["train/step_s"] = cost.train_s(tokens, rec["trained_tokens_sq"], 1, 1, cfg.ppo.minibatches, 1) * jitter()
        rec["weight_sync_s"] = cost.broadcast_s(1) * jitter()
        for batch in (1, 3, 6, 12, 24, 48, 96):
            n = 20
            rec[f"gen/decode/b{bucket_of(batch)}/steps"] = n
            rec[f"gen/decode/b{bucket_of(batch)}/seqs"] = n * batch
            rec[f"gen/decode/b{bucket_of(batch)}/s"] = n * cost.decode_step(batch, 1).at(batch * context) * jitter()
        prefill = 16 * PROMPT
        rec["gen/mixed/steps"], rec["gen/mixed/seqs"], rec["gen/mixed/prefill_tokens"] = 4, 4 * 40, prefill
        rec["gen/mixed/s"] = (4 * cost.decode_step(40, 1).at(40 * context) + cost.prefill_s(prefill, 0.0, 1)) * jitter()
        records.append(rec)
    return MeasuredRun("synthetic", cfg, tuple(records))


def test_fit_recovers_the_parameters_it_was_made_with():
    cal = fit_runs([synthetic_run()], CPU)
    assert cal.hardware == "cpu" and cal.runs == ("synthetic",)
    eff = cal.efficiency
    assert eff.decode == pytest.approx(TRUE.decode, rel=0.08)
    assert eff.step_overhead_s == pytest.approx(TRUE.step_overhead_s, rel=0.08)
    assert eff.mfu == pytest.approx(TRUE.mfu, rel=0.03)
    assert eff.prefill == pytest.approx(TRUE.prefill_mfu, rel=0.15)
    assert eff.update_overhead_s == pytest.approx(TRUE.update_overhead_s, rel=0.03)
    assert cal.reward_s.value == pytest.approx(REWARD_S, rel=0.03)
    assert cal.length_median.value == pytest.approx(LENGTHS.median, rel=0.1)
    assert cal.length_sigma.value == pytest.approx(LENGTHS.sigma, rel=0.1)
    assert cal.length_prompt_share.value == pytest.approx(LENGTHS.prompt_share, abs=0.15)
    assert cal.prompt_len.value == pytest.approx(PROMPT) and cal.prompt_tokens() == PROMPT
    # The residuals measure the +-2% noise, the points what was fitted on (first train step left out).
    for name in ("decode_efficiency", "train_mfu", "update_overhead_s"):
        assert 0 < getattr(cal, name).residual < 0.03
    assert cal.decode_efficiency.points == 12 * 7 * 20 and cal.train_mfu.points == 11
    assert len(cal.decode_by_batch) == 7


def test_lengths_mostly_at_the_cap_keep_their_tail():
    """Half the responses reach a 64-token cap: the fit matches the capped model's log moments, so
    the simulator draws as many capped traces, and the same mean length, as were measured."""
    cfg = load_config("configs/experiments/tiny-cpu.yaml", ["rollout.max_new_tokens=64"], check_files=False)
    true = LengthDistribution(median=64.0, sigma=0.8, cap=64, prompt_share=0.3)
    rng = np.random.default_rng(3)
    records, samples = [], []
    for step in range(1, 41):
        lengths = true.sample(rng, cfg.rollout.batch_prompts, cfg.rollout.group_size)
        logs = np.log(lengths)
        samples.append(lengths)
        records.append({"step": step, "trained_tokens": float((lengths + PROMPT).sum()),
                        "response_len_mean": float(lengths.mean()), "response_len_log_mean": float(logs.mean()),
                        "response_len_log_std": float(logs.std()), "response_len_log_within_std": 0.5})
    cal = fit_runs([MeasuredRun("capped", cfg, tuple(records))], CPU)
    assert cal.length_median.value == pytest.approx(true.median, rel=0.15)
    assert cal.length_sigma.value == pytest.approx(true.sigma, rel=0.15)
    measured = np.concatenate(samples)
    fitted = cal.lengths(64)
    assert fitted.capped_fraction() == pytest.approx((measured == 64).mean(), abs=0.05)
    drawn = fitted.sample(np.random.default_rng(0), 20000, 1)
    assert drawn.mean() == pytest.approx(measured.mean(), rel=0.03)


def test_training_mfu_of_a_pipelined_run_allows_for_its_bubbles():
    """Step times made with pp 2 (one micro-batch per pass here: the stages never overlap, twice
    the time) fit the MFU they were made with, not half of it."""
    cfg = load_config("configs/experiments/tiny-cpu.yaml", ["trainer.pp=2"], check_files=False)
    run = synthetic_run(steps=6, noise=0.0)
    cost = MeasuredRun("pp2", cfg, ()).cost(CPU, TRUE)
    t = cfg.trainer
    steps = tuple({**r, "train/step_s": cost.train_s(r["trained_tokens"], r["trained_tokens_sq"], 2, 1,
                                                     cfg.ppo.minibatches, 2, 2, t.micro_batch_tokens)}
                  for r in run.steps)
    assert pipeline_stretch(2, steps[0]["trained_tokens"], 1, cfg.ppo.minibatches, t.micro_batch_tokens) > 1.5
    assert fit_runs([MeasuredRun("pp2", cfg, steps)], CPU).train_mfu.value == pytest.approx(TRUE.mfu, rel=1e-6)


def test_a_stalled_prefill_record_does_not_move_the_prefill_mfu():
    """One record's prefilling iterations timed 1 s long (a gap that is not the work) among 12."""
    run = synthetic_run()
    steps = list(run.steps)
    steps[5] = {**steps[5], "gen/mixed/s": steps[5]["gen/mixed/s"] + 1.0}
    cal = fit_runs([MeasuredRun("stalled", run.cfg, tuple(steps))], CPU)
    assert cal.prefill_mfu.value == pytest.approx(TRUE.prefill_mfu, rel=0.15)


def test_one_batch_size_cannot_separate_efficiency_from_overhead():
    """Every decode at one batch size: the efficiency keeps its prior (0 points), the overhead is fitted."""
    run = synthetic_run(steps=3)
    keep = [{k: v for k, v in r.items() if not k.startswith("gen/decode/") or "/b8/" in k} for r in run.steps]
    cal = fit_runs([MeasuredRun("one", run.cfg, tuple(keep))], CPU)
    assert cal.decode_efficiency.points == 0
    assert cal.step_overhead_s.points == 3 * 20 and cal.step_overhead_s.residual < 0.03


def test_runs_without_the_measurements_keep_the_priors():
    run = synthetic_run(steps=2)
    bare = tuple({"step": r["step"], "trained_tokens": r["trained_tokens"]} for r in run.steps)
    cal = fit_runs([MeasuredRun("bare", run.cfg, bare)], CPU)
    assert all(getattr(cal, name).points == 0 for name in Calibration.parameter_names())


def test_cost_stats_of_a_batch():
    def traj(prompt: int, n: int, reward_s: float) -> Trajectory:
        return Trajectory(prompt, 0, [1, 2], list(range(n)), [0.0] * n, [0] * n, "stop", reward_s=reward_s)

    batch = [traj(0, 4, 0.1), traj(0, 16, 0.3), traj(1, 8, 0.2), traj(1, 8, 0.2)]
    s = cost_stats(batch)
    logs = np.log([4, 16, 8, 8])
    assert s["trained_tokens_sq"] == 6 ** 2 + 18 ** 2 + 2 * 10 ** 2
    assert s["reward_s_mean"] == pytest.approx(0.2)
    assert s["response_len_log_mean"] == pytest.approx(logs.mean())
    assert s["response_len_log_std"] == pytest.approx(logs.std())
    # Group 0 differs by ln 4, group 1 not at all: within sum of squares 2 (ln 2)^2 over 4 - 2 dof.
    assert s["response_len_log_within_std"] == pytest.approx(math.log(2))


def test_engine_stats_sum_timed_iterations_by_batch_class():
    stats = EngineStats()
    stats.observe(None, 0, 100)  # a prefill only: no request decoded in two iterations, untimed
    stats.observe(0.5, 3, 0)
    stats.observe(0.1, 5, 0)
    stats.observe(0.2, 5, 40)  # a prefill beside 5 decodes
    stats.interrupt()
    stats.observe(9.0, 2, 0)  # the first after a weight update: may span the pause, not timed
    stats.observe(0.1, 2, 0)
    stats.observe(0.3, 2, 0)
    assert stats.take() == pytest.approx({
        "gen/decode/b2/steps": 3, "gen/decode/b2/s": 0.9, "gen/decode/b2/seqs": 7,
        "gen/decode/b4/steps": 1, "gen/decode/b4/s": 0.1, "gen/decode/b4/seqs": 5,
        "gen/mixed/steps": 1, "gen/mixed/s": 0.2, "gen/mixed/seqs": 5, "gen/mixed/prefill_tokens": 40,
    })
    assert stats.take() == {}
    assert [bucket_of(n) for n in (1, 2, 3, 4, 127, 128)] == [1, 2, 2, 4, 64, 128]


def test_calibration_file_round_trip(tmp_path):
    cal = fit_runs([synthetic_run(steps=3)], CPU)
    path = tmp_path / "calibration.yaml"
    write_calibration(cal, path)
    back = read_calibration(path)
    assert back.efficiency == cal.efficiency and back.lengths(100) == cal.lengths(100)
    assert all(getattr(back, n) == getattr(cal, n) for n in Calibration.parameter_names())
    assert yaml.safe_load(path.read_text())["decode_by_batch"][0]["iterations"] == 3 * 20


def test_a_calibration_from_before_the_prompt_length_reads_it_as_unmeasured(tmp_path):
    cal = fit_runs([synthetic_run(steps=3)], CPU)
    data = cal.to_dict()
    del data["parameters"]["prompt_len"]
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data))
    back = read_calibration(path)
    assert back.prompt_len.points == 0 and back.prompt_tokens() is None
    assert back.efficiency == cal.efficiency


def scaling_args(path) -> list[str]:
    return ["sim", "scaling", "--model", "configs/experiments/tiny-cpu.yaml", "--context", "384", "--gpus", "2,3",
            "--calibration", str(path), "--json", "--quick"]


def test_predictions_use_the_calibration(tmp_path, capsys):
    """Slower decoding in the file, slower predictions: the parameters reach the simulator."""
    cal = fit_runs([synthetic_run(steps=3)], CPU)
    fast_path, slow_path = tmp_path / "fast.yaml", tmp_path / "slow.yaml"
    write_calibration(cal, fast_path)
    data = yaml.safe_load(fast_path.read_text())
    data["parameters"]["step_overhead_s"]["value"] *= 10
    slow_path.write_text(yaml.safe_dump(data))
    rates = []
    for path in (fast_path, slow_path):
        assert main(scaling_args(path)) == 0
        rates.append([r["tokens_per_s"] for r in json.loads(capsys.readouterr().out)])
    assert all(r > 0 for r in rates[0]) and all(s < f for f, s in zip(*rates, strict=True))


@pytest.mark.parametrize("edit, message", [
    (lambda d: "hardware: [", "not YAML"),
    (lambda d: [1, 2], "expected a mapping with hardware"),
    (lambda d: {k: v for k, v in d.items() if k != "parameters"}, "missing key 'parameters'"),
    (lambda d: {**d, "hardware": "a100"}, "hardware: unknown hardware 'a100'"),
    (lambda d: {**d, "parameters": {k: v for k, v in d["parameters"].items() if k != "train_mfu"}},
     "parameters.train_mfu: missing"),
    (lambda d: {**d, "parameters": {**d["parameters"], "decode_efficiency": {"value": "fast", "points": 1,
                                                                             "residual": None}}},
     "parameters.decode_efficiency.value: expected a number"),
    (lambda d: {**d, "parameters": {**d["parameters"], "train_mfu": {"value": 0.0, "points": 1, "residual": 0.1}}},
     "parameters.train_mfu.value: must be > 0"),
    (lambda d: {**d, "parameters": {**d["parameters"], "reward_s": {"value": 0.1, "points": -1, "residual": 0.1}}},
     "parameters.reward_s.points: expected an integer"),
    (lambda d: {**d, "parameters": {**d["parameters"], "length_sigma": {"value": 0.1}}},
     "parameters.length_sigma: missing points, residual"),
])
def test_a_malformed_calibration_is_one_message_and_exit_2(tmp_path, capsys, edit, message):
    good = tmp_path / "good.yaml"
    write_calibration(fit_runs([synthetic_run(steps=2)], CPU), good)
    bad = tmp_path / "bad.yaml"
    edited = edit(yaml.safe_load(good.read_text()))
    bad.write_text(edited if isinstance(edited, str) else yaml.safe_dump(edited))
    assert main(scaling_args(bad)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: calibration {bad}: ") and message in err and "Traceback" not in err


def test_missing_files_are_user_errors(tmp_path, capsys):
    assert main(scaling_args(tmp_path / "absent.yaml")) == 2
    assert "cannot read it" in capsys.readouterr().err
    assert main(["sim", "fit", str(tmp_path), "--out", str(tmp_path / "c.yaml")]) == 2
    assert f"run {tmp_path}: no metrics.jsonl" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "trained_tokens": 10.0}) + "\n")
    assert main(["sim", "fit", str(tmp_path), "--out", str(tmp_path / "c.yaml")]) == 2
    assert "no config.yaml and no complete checkpoint" in capsys.readouterr().err
