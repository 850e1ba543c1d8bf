"""Fit the cost model's parameters to measured runs of this system: pure functions from step
records (metrics.jsonl) and experiment configs to a Calibration (`areal-hpc sim fit` reads the
files, sim/commands.py).

Each parameter is fitted on the records that measure it, with the model the simulator predicts
with, and keeps the number of points and the RMS relative error of that model on them:

- decode efficiency and step overhead: the engines' decode-iteration times by batch size
  (`gen/decode/b<N>/...`, rollout/engine_stats.py) against CostModel.decode_step, weighted by
  iterations, in log space (Nelder-Mead);
- prefill MFU: iterations that prefill, less the decode time of their batch, per prompt token
  (the median over records: an iteration's time may hold a stall);
- training MFU: the trainer's step time (`train/step_s`) against CostModel.train_s for the run's
  layout (its tp x pp x dp, minibatches and pipeline bubbles), the first step of each run left
  out (warm-up);
- weight-update overhead: `weight_sync_s` less the update's bytes over the preset's network;
- reward latency: `reward_s_mean`;
- prompt length: trained tokens per trajectory less the mean response;
- response lengths: the capped log-normal whose log-length moments are the batches'
  (`response_len_log_*`).

A parameter its records do not measure keeps its prior (the paper calibration's, or the
assumed length distribution), written with 0 points.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from statistics import NormalDist

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.sim.calibration import FITTED, Calibration, Fitted
from areal_hpc.sim.cost_model import CostModel, Efficiency, ModelShape, pipeline_stretch
from areal_hpc.sim.fit import nelder_mead
from areal_hpc.sim.hardware import Hardware
from areal_hpc.sim.lengths import REASONING

DECODE_PREFIX = "gen/decode/b"
# Fewest iterations a batch class needs to be a decode point: a handful of iterations (the tail
# of a drain, a lone burst) time too little to fit on.
MIN_ITERATIONS = 10
_NORMAL = NormalDist()


@dataclass(frozen=True)
class MeasuredRun:
    """One run's inputs to the fit: where it came from, its config, its training-step records."""

    name: str
    cfg: ExperimentConfig
    steps: tuple[dict, ...]

    @property
    def trajectories(self) -> int:
        return self.cfg.rollout.batch_prompts * self.cfg.rollout.group_size

    def cost(self, hw: Hardware, eff: Efficiency) -> CostModel:
        return CostModel(ModelShape.from_config(self.cfg.model), hw, eff)

    def mean_context(self) -> float:
        """Tokens of an average sequence half-way through its generation: prompt + half a response."""
        rows = [r for r in self.steps if "response_len_mean" in r and "trained_tokens" in r]
        if not rows:
            return 0.0
        per_seq = sum(r["trained_tokens"] for r in rows) / (len(rows) * self.trajectories)
        response = sum(r["response_len_mean"] for r in rows) / len(rows)
        return per_seq - response / 2.0


def step_records(records: list[dict]) -> tuple[dict, ...]:
    """The training-step records of a metrics.jsonl (evaluation records carry no trained tokens)."""
    return tuple(r for r in records if "trained_tokens" in r)


def rms(errors: list[float], weights: list[float] | None = None) -> float | None:
    """Root-mean-square of `errors`, weighted when `weights` are given."""
    if not errors:
        return None
    w = weights or [1.0] * len(errors)
    return math.sqrt(sum(wi * e * e for wi, e in zip(w, errors, strict=True)) / sum(w))


@dataclass(frozen=True)
class DecodePoint:
    """Decode iterations of one batch-size class of one run: mean batch and mean seconds."""

    run: MeasuredRun
    steps: float
    batch: float
    step_s: float

    def predicted_s(self, hw: Hardware, eff: Efficiency) -> float:
        tp = self.run.cfg.generator.tensor_parallel_size
        return self.run.cost(hw, eff).decode_step(round(self.batch), tp).at(self.batch * self.run.mean_context())


def decode_points(runs: list[MeasuredRun]) -> list[DecodePoint]:
    """One point per run and batch-size class, summed over all its records."""
    out = []
    for run in runs:
        sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for r in run.steps:
            for key, value in r.items():
                if key.startswith(DECODE_PREFIX):
                    bucket, what = key[len(DECODE_PREFIX):].split("/", 1)
                    sums[bucket][what] += value
        for bucket in sorted(sums, key=int):
            s = sums[bucket]
            if s["steps"] >= MIN_ITERATIONS and s["s"] > 0:
                out.append(DecodePoint(run, s["steps"], s["seqs"] / s["steps"], s["s"] / s["steps"]))
    return out


def fit_decode(runs: list[MeasuredRun], hw: Hardware) -> tuple[Fitted, Fitted, list[DecodePoint]]:
    """(decode efficiency, step overhead, the points). With one batch-size class the two trade
    off exactly, so the efficiency keeps its prior and only the overhead is fitted."""
    points = decode_points(runs)
    if not points:
        return Fitted.prior(FITTED.decode), Fitted.prior(FITTED.step_overhead_s), points
    total = sum(p.steps for p in points)

    def eff_of(x: list[float]) -> Efficiency:
        return Efficiency(decode=min(1.0, math.exp(x[0])), step_overhead_s=math.exp(x[1]), mfu=1.0)

    def loss(eff: Efficiency) -> float:
        return sum(p.steps * math.log(p.predicted_s(hw, eff) / p.step_s) ** 2 for p in points) / total

    shortest = min(p.step_s for p in points)
    identifiable = len({round(p.batch) for p in points}) > 1
    if identifiable:
        x, _ = nelder_mead(lambda x: loss(eff_of(x)), [math.log(0.01), math.log(shortest / 2)], 0.5, 400, 1e-10)
    else:
        y, _ = nelder_mead(lambda y: loss(eff_of([math.log(FITTED.decode), y[0]])), [math.log(shortest / 2)],
                           0.5, 200, 1e-12)
        x = [math.log(FITTED.decode), y[0]]
    eff = eff_of(x)
    res = rms([p.predicted_s(hw, eff) / p.step_s - 1.0 for p in points], [p.steps for p in points])
    n = sum(round(p.steps) for p in points)
    decode = Fitted(eff.decode, n, res) if identifiable else Fitted.prior(FITTED.decode)
    return decode, Fitted(eff.step_overhead_s, n, res), points


def _mfu(rows: list[tuple[float, float, float]], pooled: bool = True) -> Fitted:
    """An MFU from (measured seconds, seconds not spent on the FLOPs, seconds of the FLOPs at peak)
    rows, with the RMS relative error of each row's time. Pooled: all FLOPs over all compute
    seconds. Else the FLOP-weighted median of the rows' compute seconds per FLOP, which a few rows
    holding a long stall that is not the work cannot move."""
    if not rows:
        return Fitted.prior(FITTED.mfu)
    if pooled:
        seconds = sum(measured - fixed for measured, fixed, _ in rows)
        per_flop = seconds / sum(at_peak for *_, at_peak in rows)
    else:
        per_flop = weighted_median([((measured - fixed) / at_peak, at_peak) for measured, fixed, at_peak in rows])
    if per_flop <= 0:
        return Fitted.prior(FITTED.mfu)
    mfu = min(1.0, 1.0 / per_flop)
    return Fitted(mfu, len(rows), rms([(fixed + at_peak / mfu) / measured - 1.0 for measured, fixed, at_peak in rows]))


def weighted_median(pairs: list[tuple[float, float]]) -> float:
    """The value at half the total weight of (value, weight) pairs."""
    ordered = sorted(pairs)
    half, seen = sum(w for _, w in ordered) / 2.0, 0.0
    for value, weight in ordered:
        seen += weight
        if seen >= half:
            return value
    return ordered[-1][0]


def fit_prefill(runs: list[MeasuredRun], hw: Hardware, decode: Efficiency) -> Fitted:
    """MFU of the prompt tokens of prefilling iterations, their decode share taken off: the median
    over the records, as an iteration's time is an inter-token gap (rollout/engine_stats.py) that
    also holds whatever kept the engine from its next iteration (measured on 2 CPU cores: one
    iteration of 1.0 s for 856 prompt tokens beside seven records prefilling 28,000-46,000
    tokens/s; pooled, it made the fitted prefill 2.4x slower)."""
    rows = []
    for run in runs:
        cost = run.cost(hw, decode)
        tp = run.cfg.generator.tensor_parallel_size
        for r in run.steps:
            steps, tokens = r.get("gen/mixed/steps", 0.0), r.get("gen/mixed/prefill_tokens", 0.0)
            if steps <= 0 or tokens <= 0:
                continue
            batch = r["gen/mixed/seqs"] / steps
            decode_s = steps * cost.decode_step(round(batch), tp).at(batch * run.mean_context())
            rows.append((r["gen/mixed/s"], decode_s, cost.forward_flops(tokens, 0.0) / (tp * hw.peak_flops)))
    return _mfu(rows, pooled=False)


def fit_train(runs: list[MeasuredRun], hw: Hardware) -> Fitted:
    """Training MFU: FLOPs (stretched by the layout's pipeline bubbles) over the compute share of
    the trainer's step times, all runs pooled."""
    rows = []
    for run in runs:
        t = run.cfg.trainer
        gpus, replica = t.tp * t.pp * t.dp, t.tp * t.pp
        cost = run.cost(hw, FITTED)
        for r in run.steps[1:]:
            if "train/step_s" not in r:
                continue
            tokens = r["trained_tokens"]
            sq = r.get("trained_tokens_sq", tokens * tokens / run.trajectories)
            stretch = pipeline_stretch(t.pp, tokens, t.dp, run.cfg.ppo.minibatches, t.micro_batch_tokens)
            comm = cost.train_comm_s(tokens, gpus, t.dp, run.cfg.ppo.minibatches, replica, t.pp, t.micro_batch_tokens)
            rows.append((r["train/step_s"], comm, 4.0 * cost.forward_flops(tokens, sq) * stretch / (gpus * hw.peak_flops)))
    return _mfu(rows)


def fit_update(runs: list[MeasuredRun], hw: Hardware) -> Fitted:
    """Fixed seconds of a weight update: the measured update less its bytes over the network."""
    rows = []
    for run in runs:
        transfer = run.cost(hw, FITTED).broadcast_s(run.cfg.trainer.pp)
        rows += [(r["weight_sync_s"], transfer) for r in run.steps if "weight_sync_s" in r]
    if not rows:
        return Fitted.prior(0.0)
    overhead = max(0.0, sum(s - t for s, t in rows) / len(rows))
    return Fitted(overhead, len(rows), rms([(overhead + t) / s - 1.0 for s, t in rows if s > 0]))


def fit_mean(runs: list[MeasuredRun], key: str, prior: float) -> Fitted:
    """The mean of one metric over all records, its relative spread as the residual."""
    values = [r[key] for run in runs for r in run.steps if key in r]
    if not values:
        return Fitted.prior(prior)
    mean = sum(values) / len(values)
    return Fitted(mean, len(values), rms([v / mean - 1.0 for v in values]) if mean > 0 else None)


def censored_log_moments(mu: float, sigma: float, cap: float) -> tuple[float, float]:
    """Mean and variance of min(Y, ln cap) for Y ~ N(mu, sigma^2): the log length of the capped
    log-normal the simulator draws (lengths.LengthDistribution), as a batch's statistics see it."""
    c = math.log(cap)
    if sigma <= 0.0:
        return min(mu, c), 0.0
    a = (c - mu) / sigma
    below, density = _NORMAL.cdf(a), _NORMAL.pdf(a)
    mean = mu * below - sigma * density + c * (1.0 - below)
    square = (mu * mu + sigma * sigma) * below - sigma * (mu + c) * density + c * c * (1.0 - below)
    return mean, max(0.0, square - mean * mean)


def fit_lengths(runs: list[MeasuredRun]) -> tuple[Fitted, Fitted, Fitted]:
    """(median, sigma, prompt share) of the capped log-normal whose log lengths have the records'
    mean and variance, each run at its own cap (rollout.max_new_tokens): the variance is the
    batches' own plus that of their means (lengths drift over a run). The capped model's moments
    are matched, not the uncapped one's: a run whose responses mostly reach the cap measures a
    narrow spread below it, which fitted as if uncapped gives a tail that seldom reaches the cap
    (fewer, shorter traces than measured). The prompt share is the part of the variance not left
    within groups."""
    rows: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
    for run in runs:
        rows[run.cfg.rollout.max_new_tokens] += [
            (r["response_len_log_mean"], r["response_len_log_std"], r["response_len_log_within_std"])
            for r in run.steps if "response_len_log_within_std" in r]
    rows = {cap: rs for cap, rs in rows.items() if rs}
    if not rows:
        return Fitted.prior(REASONING.median), Fitted.prior(REASONING.sigma), Fitted.prior(REASONING.prompt_share)
    everything = [row for rs in rows.values() for row in rs]
    n = len(everything)
    mu0, var0 = _log_moments(everything)
    targets = {cap: (len(rs), *_log_moments(rs)) for cap, rs in rows.items()}

    def loss(x: list[float]) -> float:
        total = 0.0
        for cap, (k, m, v) in targets.items():
            mean, var = censored_log_moments(x[0], math.exp(x[1]), cap)
            total += k * ((mean - m) ** 2 + (var - v) ** 2)
        return total / n

    if var0 > 0:
        x, _ = nelder_mead(loss, [mu0, 0.5 * math.log(var0)], 0.5, 2000, 1e-16)
        mu, sigma = x[0], math.exp(x[1])
    else:
        mu, sigma = mu0, 0.0
    within = sum(w * w for _, _, w in everything) / n
    share = min(1.0, max(0.0, 1.0 - within / var0)) if var0 > 0 else 0.0
    model = {cap: censored_log_moments(mu, sigma, cap) for cap in rows}
    mean_errors = [math.exp(m - model[cap][0]) - 1.0 for cap, rs in rows.items() for m, _, _ in rs]
    spread_errors = [s / math.sqrt(model[cap][1]) - 1.0 for cap, rs in rows.items() for _, s, _ in rs
                     if model[cap][1] > 0]
    return (Fitted(math.exp(mu), n, rms(mean_errors)), Fitted(sigma, n, rms(spread_errors)),
            Fitted(share, n, None))


def _log_moments(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Mean and variance of the log lengths of batches given by (mean, std, within-group std)."""
    n = len(rows)
    mu = sum(m for m, _, _ in rows) / n
    return mu, sum(s * s for _, s, _ in rows) / n + sum((m - mu) ** 2 for m, _, _ in rows) / n


def fit_prompt_len(runs: list[MeasuredRun]) -> Fitted:
    """Prompt tokens of a trajectory (chat template included): each batch's trained tokens per
    trajectory less its mean response. Not measured: 0 points, and the workload keeps the task's
    assumption (workload.PROMPT_TOKENS)."""
    values = [r["trained_tokens"] / run.trajectories - r["response_len_mean"]
              for run in runs for r in run.steps if "response_len_mean" in r]
    if not values:
        return Fitted.prior(0.0)
    mean = sum(values) / len(values)
    return Fitted(mean, len(values), rms([v / mean - 1.0 for v in values]) if mean > 0 else None)


def fit_runs(runs: list[MeasuredRun], hw: Hardware) -> Calibration:
    """Every parameter, fitted on all the runs together."""
    decode, overhead, points = fit_decode(runs, hw)
    decode_eff = Efficiency(decode.value, overhead.value, mfu=1.0)
    median, sigma, share = fit_lengths(runs)
    return Calibration(
        hardware=hw.name.lower(),
        runs=tuple(run.name for run in runs),
        decode_efficiency=decode,
        step_overhead_s=overhead,
        prefill_mfu=fit_prefill(runs, hw, decode_eff),
        train_mfu=fit_train(runs, hw),
        update_overhead_s=fit_update(runs, hw),
        reward_s=fit_mean(runs, "reward_s_mean", 0.0),
        prompt_len=fit_prompt_len(runs),
        length_median=median,
        length_sigma=sigma,
        length_prompt_share=share,
        decode_by_batch=tuple((p.batch, p.steps, p.step_s, p.predicted_s(hw, decode_eff)) for p in points),
    )
