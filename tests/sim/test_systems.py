"""Asynchronous and synchronous schedules: their defining properties on small setups."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import pytest

from areal_hpc.sim.async_system import run_async
from areal_hpc.sim.cost_model import Efficiency
from areal_hpc.sim.hardware import H800
from areal_hpc.sim.layout import Layout
from areal_hpc.sim.run import Run
from areal_hpc.sim.sync_system import run_sync
from tests.sim.conftest import SMALL, FixedLengths, cost_1p5b, fleet_for, split, stream


def test_eta_zero_is_the_synchronous_schedule_on_the_same_split():
    cost = cost_1p5b()
    layout = split(engines=4, train_dp=2)
    w = SMALL.with_eta(0)
    a = run_async(layout, cost, w, fleet_for(layout, cost, w), 4, stream(w))
    s = run_sync(layout, cost, w, fleet_for(layout, cost, w), len(a.step_ends), 1, stream(w))
    assert a.step_tokens == s.step_tokens
    assert a.step_ends == pytest.approx(s.step_ends, rel=1e-12)
    assert a.max_staleness == 0


def test_staleness_never_exceeds_eta_and_more_staleness_is_faster():
    cost = cost_1p5b()
    layout = split(engines=4)
    rates = []
    for eta in (0, 1, 2, 4):
        w = SMALL.with_eta(eta)
        run = run_async(layout, cost, w, fleet_for(layout, cost, w), 5, stream(w))
        assert run.max_staleness <= eta
        rates.append(run.tokens_per_s)
    assert rates[1] > 1.2 * rates[0]
    assert rates == sorted(rates) or max(rates) <= 1.02 * rates[-1]


def test_the_admission_gate_is_never_slower_and_lets_staleness_past_eta():
    """The simulator runs the controller's gate: AReaL's admission-only rule at a small eta
    (stragglers no longer hold the trainer) against the strict one, the same layout and lengths."""
    cost = cost_1p5b()
    layout = split(engines=4)
    w = SMALL.with_eta(1)
    strict = run_async(layout, cost, w, fleet_for(layout, cost, w), 6, stream(w))
    loose_w = w.with_gate("admission")
    loose = run_async(layout, cost, loose_w, fleet_for(layout, cost, loose_w), 6, stream(loose_w))
    assert strict.max_staleness <= 1 < loose.max_staleness
    assert loose.tokens_per_s > 1.05 * strict.tokens_per_s


def test_more_generators_never_lower_throughput_until_the_trainer_saturates():
    # fixed efficiencies (not the calibrated ones) with a slow trainer, to reach its ceiling
    cost = replace(cost_1p5b(), eff=Efficiency(decode=0.1, step_overhead_s=0.025, mfu=0.05))
    w = replace(SMALL, eta=None, max_concurrent=1024, minibatches=4)
    runs = []
    for engines in (1, 2, 4, 8, 16, 32):
        layout = split(engines=engines)
        runs.append(run_async(layout, cost, w, fleet_for(layout, cost, w), 6, stream(w)))
    for fewer, more in pairwise(runs):
        assert more.tokens_per_s >= 0.98 * min(fewer.tokens_per_s, more.trainer_bound_tokens_per_s)
    assert runs[0].train_idle > 0.4 and runs[0].tokens_per_s < 0.5 * runs[0].trainer_bound_tokens_per_s
    # saturated: the trainer never waits and the rate is its ceiling
    assert runs[-1].train_idle < 0.01
    assert runs[-1].tokens_per_s == pytest.approx(runs[-1].trainer_bound_tokens_per_s, rel=0.01)


def test_sync_step_time_grows_with_the_longest_sequence():
    cost = cost_1p5b()
    layout = split(engines=2)
    w = replace(SMALL, batch_prompts=4)
    times = []
    for longest in (200, 400, 800, 1000):
        groups = [[200] * 4 for _ in range(4)]
        groups[2][1] = longest
        run = run_sync(layout, cost, w, fleet_for(layout, cost, w), 1, 0, FixedLengths(groups))
        times.append(run.step_ends[0])
    gains = [b - a for a, b in pairwise(times)]
    assert all(g > 0 for g in gains)
    # each extra token of the longest sequence costs at least one decode step's fixed overhead
    assert gains[0] >= 200 * cost.eff.step_overhead_s


def test_colocated_sync_alternates_and_idles_in_the_tail():
    cost = cost_1p5b()
    layout = Layout(True, gpus=4, engines=4, gen_tp=1, train_dp=4)
    run = run_sync(layout, cost, SMALL, fleet_for(layout, cost), 4, 1, stream())
    assert run.train_idle == 0.0
    assert 0.0 < run.gen_idle < 1.0
    assert 0.0 < run.gpu_idle < 1.0
    assert run.tokens_per_s > 0


def test_run_measures_the_steady_steps_by_hand():
    run = Run(step_ends=(100.0, 300.0, 500.0), step_tokens=(7, 1000, 3000), warmup=1,
              gen_busy_gpu_s=2400.0, train_busy_gpu_s=200.0, gen_gpus=6, train_gpus=2, colocated=False,
              max_staleness=0)
    assert run.tokens_per_s == pytest.approx(4000 / 400)
    assert run.step_s == 200.0 and run.steps_per_hour == 18.0
    assert run.hours(10) == pytest.approx((100 + 9 * 200) / 3600)
    assert run.gen_idle == pytest.approx(1 - 2400 / (6 * 400))
    assert run.train_idle == pytest.approx(1 - 200 / (2 * 400))
    assert run.trainer_bound_tokens_per_s == pytest.approx(4000 / 100)


def test_weight_update_pauses_count_as_not_generating_as_the_controller_counts_them():
    """Two measured steps, each followed (in the window) by a 10 s pause of all 6 generator GPUs:
    busy for gen_idle, not generating for the controller's generator_idle_fraction."""
    run = Run(step_ends=(100.0, 300.0, 500.0), step_tokens=(7, 1000, 3000), warmup=1,
              gen_busy_gpu_s=2400.0, train_busy_gpu_s=200.0, gen_gpus=6, train_gpus=2, colocated=False,
              max_staleness=0, update_s=10.0)
    assert run.gen_idle == 0.0
    assert run.gen_not_generating == pytest.approx(1 - (2400 - 2 * 10 * 6) / (6 * 400))


def test_simulated_update_pauses_are_in_the_generators_idle_share():
    cost = cost_1p5b()
    slow_update = replace(cost, eff=replace(cost.eff, update_overhead_s=2.0))
    layout = split(engines=2)
    run = run_async(layout, slow_update, SMALL, fleet_for(layout, slow_update), 6, stream())
    assert run.update_s == pytest.approx(layout.update_s(slow_update)) and run.update_s >= 2.0
    steps = len(run.step_ends) - run.warmup
    assert run.gen_not_generating == pytest.approx(
        min(1.0, run.gen_idle + steps * run.update_s / run.window_s), abs=1e-9)
    assert run.gen_not_generating > run.gen_idle


def test_on_one_shared_host_more_processes_than_cores_run_slower():
    """The cpu preset's runs share its 2 cores: a layout with a core per process is as on separate
    devices; with 3 engines and a trainer on them every step takes longer, and a step is never
    shorter than on separate devices."""
    own = replace(cost_1p5b(), hw=replace(H800, gpus_per_node=2))
    shared = replace(own, hw=replace(own.hw, one_host=True))
    runs = {}
    for engines in (1, 3):
        layout = split(engines=engines)
        runs[engines] = [run_async(layout, c, SMALL, fleet_for(layout, c), 5, stream()) for c in (own, shared)]
    alone, together = runs[1]
    assert together.step_ends == pytest.approx(alone.step_ends, rel=1e-12)
    alone, together = runs[3]
    assert together.step_s > 1.2 * alone.step_s
    assert all(b >= a - 1e-9 for a, b in zip(alone.step_ends, together.step_ends, strict=True))
