"""The fluid generation engine: closed-form decode time, preemption, inverse consistency."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_hpc.sim.cost_model import CostModel, Efficiency
from areal_hpc.sim.engine import Engine, Fleet, make_group
from tests.sim.conftest import cost_1p5b


def ideal_cost(overhead: float = 0.0) -> CostModel:
    base = cost_1p5b()
    return CostModel(base.shape, base.hw, Efficiency(decode=1.0, step_overhead_s=overhead, mfu=0.5))


def run_until_idle(fleet: Fleet) -> list[tuple[float, int]]:
    finished = []
    while not math.isinf(fleet.next_time()):
        when, done = fleet.pop()
        finished += [(when, t.ident) for t in done]
    return finished


def test_memory_bound_batch_finishes_at_the_hand_computed_time():
    cost = ideal_cost(overhead=0.002)
    n, prompt, length = 8, 100, 500
    fleet = Fleet([Engine(cost, tp=1, kv_capacity=10**7, max_num_seqs=64)])
    fleet.submit([make_group(0, 0, prompt, [length] * n)], now=0.0)
    finished = run_until_idle(fleet)
    assert len(finished) == n
    s = cost.shape
    bw = cost.hw.hbm_bw
    prefill = n * cost.prefill_s(prompt, prompt**2, 1)
    # step k reads the weights and the n * (prompt + k) cached tokens: integrate over k in [0, L]
    decode = (length * (0.002 + s.params * 2 / bw)
              + s.kv_bytes_per_token / bw * n * (prompt * length + length**2 / 2))
    # memory-bound throughout: the compute line stays below the memory line
    step = cost.decode_step(n, 1)
    assert step.cmp0 + step.cmp1 * n * (prompt + length) < step.mem0 + step.mem1 * n * (prompt + length)
    assert finished[-1][0] == pytest.approx(prefill + decode, rel=1e-9)


def test_shorter_sequences_finish_first_and_free_their_slot():
    cost = ideal_cost()
    fleet = Fleet([Engine(cost, tp=1, kv_capacity=10**7, max_num_seqs=2)])
    fleet.submit([make_group(0, 0, 10, [100, 300, 50])], now=0.0)
    finished = run_until_idle(fleet)
    # slots: 100 and 300 start; 50 waits for the 100 to finish, then overtakes the 300
    assert [i for _, i in finished] == [0, 2, 1]


def test_full_kv_cache_preempts_and_everything_still_finishes():
    cost = ideal_cost()
    lengths = [2000] * 6

    def finish(capacity: int) -> float:
        fleet = Fleet([Engine(cost, tp=1, kv_capacity=capacity, max_num_seqs=64)])
        fleet.submit([make_group(0, 0, 100, lengths)], now=0.0)
        done = run_until_idle(fleet)
        assert sorted(i for _, i in done) == list(range(6))
        return done[-1][0]

    roomy = finish(10**6)
    tight = finish(3 * 2100)  # three full sequences fit, six are admitted at first
    assert tight > roomy


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), context=st.integers(0, 2_000_000), k=st.floats(0.5, 5000.0))
def test_advancing_by_the_time_of_k_steps_makes_k_steps(n, context, k):
    eng = Engine(ideal_cost(0.001), tp=1, kv_capacity=10**9, max_num_seqs=512)
    eng.n, eng.a = n, float(context)
    dt = eng.time_for(k)
    eng.advance_to(dt)
    assert eng.s == pytest.approx(k, rel=1e-7)


def test_interrupt_recomputes_the_cache_of_running_sequences():
    cost = ideal_cost()
    eng = Engine(cost, tp=1, kv_capacity=10**7, max_num_seqs=8)
    fleet = Fleet([eng])
    fleet.submit([make_group(0, 0, 200, [1000, 1000])], now=0.0)
    t0 = eng.t
    eng.advance_to(t0 + 0.1)
    ctx, sq = eng.context(), eng.sq_context()
    assert ctx == pytest.approx(2 * (200 + eng.s))
    eng.interrupt(t0 + 0.1, pause_s=0.5, reprefill=True)
    assert eng.t == pytest.approx(t0 + 0.1 + 0.5 + cost.prefill_s(ctx, sq, 1))
