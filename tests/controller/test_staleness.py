"""The staleness manager against the paper's rule, in a simulated asynchronous run."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_hpc.controller.scheduler import Policy, Scheduler, Submit, Train
from areal_hpc.controller.staleness import StalenessManager
from areal_hpc.wire.messages import Trajectory


def paper_admits(eta: int, b: int, version: int, accepted: int, running: int, max_concurrent: int) -> bool:
    """The paper's rule for the next request, N_r = accepted + running + 1."""
    n_r = accepted + running + 1
    return (n_r - 1) // b <= version + eta and running < max_concurrent


@given(
    eta=st.integers(0, 8),
    b=st.integers(1, 16),
    version=st.integers(0, 50),
    accepted=st.integers(0, 1000),
    running=st.integers(0, 64),
    max_concurrent=st.integers(1, 64),
)
def test_capacity_is_the_formula_and_the_paper_rule(eta, b, version, accepted, running, max_concurrent):
    sm = StalenessManager(eta, b, max_concurrent, version=version, accepted=accepted, running=running)
    expected = min(max_concurrent - running, (eta + version + 1) * b - (accepted + running))
    assert sm.capacity() == expected
    assert (sm.capacity() > 0) == paper_admits(eta, b, version, accepted, running, max_concurrent)


def test_submit_beyond_capacity_raises():
    sm = StalenessManager(eta=0, batch_prompts=2, max_concurrent=8)
    sm.submit(2)
    with pytest.raises(RuntimeError):
        sm.submit(1)
    sm.accept(2)
    assert sm.capacity() == 0  # synchronous: the next batch waits for version 1
    sm.set_version(1)
    assert sm.capacity() == 2


def traj(pid: int, i: int) -> Trajectory:
    return Trajectory(pid, i, [1], [2], [0.0], [0], "stop")


GENERATORS = [5, 6, 7]


def scheduler(eta: int, b: int, mc: int, gate: str = "strict", state: dict | None = None) -> Scheduler:
    policy = Policy(eta, b, group_size=1, max_concurrent=mc, gate=gate, total_steps=10**6)
    return Scheduler(policy, GENERATORS, train_size=10**6, held_out_size=0, shuffle=False, state=state)


class Sim:
    """Drives the controller's Scheduler with random, heavy-tailed generation times: the scheduler
    decides, the Sim only plays the generators and the trainer."""

    def __init__(self, sched: Scheduler, rng: random.Random):
        self.sched, self.rng = sched, rng
        self.finish_at: dict[int, float] = {}
        self.now = 0.0
        self.trained: list[tuple[int, list[tuple[int, int]]]] = []  # (version, [(prompt, submit version)])

    def run(self, steps: int) -> None:
        sched = self.sched
        target = sched.version + steps
        while sched.version < target:
            trained = False
            for c in sched.poll():
                if isinstance(c, Submit):
                    self.finish_at[c.prompt_id] = self.now + self.rng.expovariate(1.0) * self.rng.choice([1, 1, 10])
                elif isinstance(c, Train):
                    self.trained.append((c.version, [(g.prompt_id, g.version) for g in c.groups]))
                    sched.on_step_done(c.version + 1)
                    sched.on_weights_sent(0, c.version + 1, {})
                    for g in GENERATORS:
                        sched.on_weights_loaded(g, c.version + 1, {})
                    trained = True
            if trained:
                continue
            pid = min(self.finish_at, key=self.finish_at.get)
            self.now = self.finish_at.pop(pid)
            sched.on_trajectory(traj(pid, 0))


def simulated(eta: int, b: int, mc: int, seed: int, gate: str = "strict") -> Sim:
    sched = scheduler(eta, b, mc, gate)
    sched.start_training()
    return Sim(sched, random.Random(seed))


@settings(max_examples=60, deadline=None)
@given(eta=st.integers(0, 6), b=st.integers(1, 6), mc=st.integers(1, 24), seed=st.integers(0, 10**6))
def test_every_trained_prompt_respects_the_bound(eta, b, mc, seed):
    sim = simulated(eta, b, mc, seed)
    sim.run(12)
    for version, prompts in sim.trained:
        assert len(prompts) == b
        assert all(version - submitted <= eta for _, submitted in prompts)
    ids = [p for _, prompts in sim.trained for p, _ in prompts]
    assert len(ids) == len(set(ids))


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 6), mc=st.integers(1, 24), seed=st.integers(0, 10**6))
def test_eta_zero_is_synchronous(b, mc, seed):
    sim = simulated(0, b, mc, seed)
    sim.run(8)
    for version, prompts in sim.trained:
        assert {submitted for _, submitted in prompts} == {version}
    assert [p for _, ps in sim.trained for p, _ in ps] == sorted(p for _, ps in sim.trained for p, _ in ps)


@settings(max_examples=40, deadline=None)
@given(eta=st.integers(0, 6), b=st.integers(1, 6), mc=st.integers(1, 24), seed=st.integers(0, 10**6))
def test_state_survives_resume(eta, b, mc, seed):
    """Stop mid-run, restore from the scheduler's state (in-flight prompts back in the queue),
    continue: the bound holds after resume and no prompt is trained twice or lost."""
    sim = simulated(eta, b, mc, seed)
    sim.run(5)
    state = json.loads(json.dumps(sim.sched.state_dict()))  # as a checkpoint stores it
    sm = scheduler(eta, b, mc, state=state).sm
    assert (sm.version, sm.accepted, sm.running) == (sim.sched.version, sim.sched.sm.accepted, 0)
    assert sm.capacity() == min(mc, (eta + sm.version + 1) * b - sm.accepted)
    resumed = Sim(scheduler(eta, b, mc, state=state), random.Random(seed + 1))
    resumed.sched.start_training()
    resumed.run(6)
    for version, prompts in resumed.trained:
        assert all(version - submitted <= eta for _, submitted in prompts)
    before = [p for _, ps in sim.trained for p, _ in ps]
    after = [p for _, ps in resumed.trained for p, _ in ps]
    trained = before + after
    assert len(trained) == len(set(trained))
    buf = resumed.sched.buffer
    leftover = set(buf.running_ids()) | set(buf.ready_ids())
    assert set(trained) | leftover == set(range(resumed.sched.stream.position))


def test_a_straggler_holds_the_batch_only_when_it_must():
    # eta = 1, B = 1: prompt 0 (version 0) is still running at version 1.
    sm = StalenessManager(eta=1, batch_prompts=1, max_concurrent=8, version=1)
    ready = Counter({1: 1})  # the batch: one complete prompt of version 1
    assert not sm.may_train(Counter({0: 1}), ready)  # training it now would leave prompt 0 too stale
    assert sm.may_train(Counter({1: 1, 2: 1}), ready)  # version 1 may still be trained at 2, version 2 at 3
    assert not sm.may_train(Counter({1: 2}), ready)  # ... but only one prompt fits in the batch of version 2
    sm = StalenessManager(eta=2, batch_prompts=1, max_concurrent=8, version=1)
    assert sm.may_train(Counter({0: 1}), ready)  # eta = 2: prompt 0 can still be trained at version 2


def test_the_admission_gate_never_holds_a_ready_batch():
    sm = StalenessManager(eta=1, batch_prompts=1, max_concurrent=8, gate="admission", version=1)
    ready = Counter({1: 1})
    assert sm.may_train(Counter({0: 1}), ready) and sm.may_train(Counter({1: 2}), ready)


def max_trained_staleness(sim: Sim) -> int:
    return max(version - submitted for version, prompts in sim.trained for _, submitted in prompts)


def test_the_admission_gate_trains_stragglers_older_than_eta_where_the_strict_one_waits():
    """Same seeds and heavy-tailed generation times: AReaL's admission-only rule lets a straggler be
    trained beyond eta (its batches are never held) and so finishes sooner; the strict gate keeps
    every trained prompt within eta."""
    loose, strict = [], []
    for seed in range(8):
        for gate, out in (("admission", loose), ("strict", strict)):
            sim = simulated(1, 4, 16, seed, gate)
            sim.run(30)
            ids = [p for _, prompts in sim.trained for p, _ in prompts]
            assert len(ids) == len(set(ids))
            out.append((max_trained_staleness(sim), sim.now))
    assert all(s <= 1 for s, _ in strict)
    assert max(s for s, _ in loose) > 1
    assert sum(t for _, t in loose) < sum(t for _, t in strict)


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 6), mc=st.integers(1, 24), seed=st.integers(0, 10**6))
def test_eta_zero_is_synchronous_under_either_gate(b, mc, seed):
    sim = simulated(0, b, mc, seed, "admission")
    sim.run(8)
    for version, prompts in sim.trained:
        assert {submitted for _, submitted in prompts} == {version}


def feasible(untrained: list[int], version: int, eta: int, batch: int) -> bool:
    """The strict gate's definition, prompt by prompt: with B slots in each later batch, earliest
    deadline first, every untrained prompt submitted at v is trained by version v + eta."""
    for slot, v in enumerate(sorted(untrained)):
        if slot // batch + version + 1 > v + eta:
            return False
    return True


@settings(max_examples=300, deadline=None)
@given(versions=st.lists(st.tuples(st.integers(0, 8), st.booleans()), max_size=60),
       batch=st.integers(1, 8), version=st.integers(0, 8), eta=st.integers(0, 4))
def test_the_count_form_of_the_strict_gate_is_its_definition(versions, batch, version, eta):
    running = Counter(v for v, done in versions if not done)
    ready = Counter(v for v, done in versions if done)
    if sum(ready.values()) < batch:
        return
    untrained = sorted(running.elements()) + sorted(ready.elements())[batch:]
    sm = StalenessManager(eta, batch, max_concurrent=1000, version=version)
    assert sm.may_train(running, ready) == feasible(untrained, version, eta, batch)
