"""benchmarks/chaos.py without running a job: the schedules drawn from seeds, the faults the run
is asked to make, the invariants against run directories written here, and the report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from bench_scripts import loaded

from areal_hpc.controller import checkpoint as ck


@pytest.fixture(scope="module")
def chaos():
    with loaded("chaos") as module:
        yield module


def test_schedules_are_seeded_and_keep_their_limits(chaos):
    for seed in range(300):
        drawn = chaos.draw(seed, 10)
        assert drawn == chaos.draw(seed, 10)
        kinds = [i.kind for i in drawn]
        assert 1 <= len(drawn) <= 3 and all(2 <= i.step <= 7 for i in drawn)
        assert sum(k in chaos.LOSES_GENERATOR for k in kinds) <= 1
        assert sum(k in chaos.ENDING for k in kinds) <= 1 and kinds.count("custom-reward") <= 1
        lost = {i.generator for i in drawn if i.kind in chaos.LOSES_GENERATOR}
        assert all(i.generator not in lost for i in drawn if i.kind == "generator-stop")
    every = {i.kind for seed in range(300) for i in chaos.draw(seed, 10)}
    assert every == set(chaos.IN_PLACE) | set(chaos.ENDING)


def test_the_faults_the_run_makes_itself(chaos):
    at = chaos.Injection
    drawn = [at("generator-kill", 3, 1), at("engine-kill", 4, 0), at("trainer-kill", 5, 0),
             at("generator-stall", 2, 0)]
    assert chaos.fault_env(drawn) == "generator:1:update@3:kill,trainer:0:step@5:kill,generator:0:request@8:stall"
    assert chaos.fault_env([at("engine-stop", 3, 0)]) == ""


def whole_run(run_dir: Path, steps: int, batch: int) -> None:
    """A run directory as a run that held every invariant leaves it."""
    run_dir.mkdir(parents=True)
    ledger = [{"step": s, "prompt_ids": list(range(s * batch, (s + 1) * batch))} for s in range(steps)]
    (run_dir / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ledger))
    records = [{"step": s, "version": s, "trained_tokens": 100.0, "wall_time": 10.0 + s} for s in range(1, steps + 1)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    d = ck.step_dir(run_dir / "checkpoints", 2)
    d.mkdir(parents=True)
    (d / "controller.json").write_text("{}")
    ck.mark_complete(d)


def test_each_invariant_names_what_broke(chaos, tmp_path):
    run_dir = tmp_path / "run"
    whole_run(run_dir, 4, 2)
    A = chaos.Attempt
    finished = A(0, 0, 30.0, False, 4, 14.0, 0)
    assert chaos.invariant_problems(run_dir, 4, 2, [finished], [False], []) == []
    ended, resumed = A(137, None, 20.0, False, 3, 13.0, 0), A(0, 0, 30.0, False, 4, 14.0, 2)
    assert chaos.invariant_problems(run_dir, 4, 2, [ended, resumed], [True, False], []) == []

    lines = (run_dir / "ledger.jsonl").read_text().splitlines()
    (run_dir / "ledger.jsonl").write_text("\n".join([lines[0], lines[0], *lines[2:]]) + "\n")
    metrics = (run_dir / "metrics.jsonl").read_text()
    (run_dir / "metrics.jsonl").write_text(metrics + '{"step": 4, "version": 4, "trained_tokens": 1.0}\n')
    (ck.step_dir(run_dir / "checkpoints", 2) / "controller.json").write_text("[]")
    found = chaos.invariant_problems(run_dir, 4, 2, [A(0, 0, 1.0, True, 2, 12.0, 0), A(0, 0, 1.0, False, 4, 14.0, 0),
                                                      A(1, 1, 1.0, False, 4, 14.0, 0)], [False, True, False],
                                     [123, 456])
    assert found[0].startswith("ledger: steps [0, 0, 2, 3], not 0..3 once each"), found
    assert "ledger: 2 prompts trained twice" in found
    assert "ledger: the prompts trained are not the first 8 of the data order once each" in found
    assert "metrics: trained steps [1, 2, 3, 4, 4], not 1..4 once each" in found
    assert "metrics: versions [1, 2, 3, 4, 4] do not increase" in found
    assert "checkpoint step-00000002: controller.json: its contents changed since the checkpoint was written" in found
    assert found[-4:] == ["processes: 2 of the job still running after it ended", "run 1: still running after its timeout",
                          "run 2: rank 0 exited 0 although a fault ended the job", "run 3: rank 0's exit status 1, not 0"]


def test_recovery_in_place_and_across_a_restart(chaos):
    A = chaos.Attempt
    steady = [{"step": s, "wall_time": 10.0 + 2 * s} for s in range(1, 6)]
    hit = steady[:2] + [{"step": s, "wall_time": 20.0 + 2 * s} for s in range(3, 6)]  # a 12 s gap
    assert chaos.recovery_s(steady, [A(0, 0, 1.0, False, 5, 20.0, 0)]) == 0.0
    assert chaos.recovery_s(hit, [A(0, 0, 1.0, False, 5, 30.0, 0)]) == 10.0
    # Ended after step 3 (at t 16), resumed from 2: steps 3 and 4 of the new run at t 60 and 62.
    resumed = steady[:2] + [{"step": 3, "wall_time": 60.0}, {"step": 4, "wall_time": 62.0}]
    attempts = [A(137, None, 1.0, False, 3, 16.0, 0), A(0, 0, 1.0, False, 4, 62.0, 2)]
    assert chaos.recovery_s(resumed, attempts) == 46.0


def test_the_report_counts_faults_survived_by_kind(chaos, tmp_path):
    held = {"injected": ["engine-kill", "reward-worker-kill"], "violations": [], "steps_lost": 0, "recovery_s": 4.0}
    broke = {"injected": ["trainer-kill", "reward-worker-kill"], "violations": ["ledger: x"], "steps_lost": 1,
             "recovery_s": 40.0}
    report = chaos.summary([held, broke], "cmd", 8)
    assert (report["schedules"], report["violations"], report["steps_lost"]) == (2, 1, 1)
    assert report["by_kind"] == {"engine-kill": {"injected": 1, "survived": 1},
                                 "reward-worker-kill": {"injected": 2, "survived": 1},
                                 "trainer-kill": {"injected": 1, "survived": 0}}
    assert list(report)[:2] == ["schedules", "violations"]
    assert "invariant violations 1 (goal 0), steps lost 1, recovery median 22.0 s, max 40.0 s" in chaos.table(report)
    chaos.plot(report, tmp_path / "chaos.png")
    assert (tmp_path / "chaos.png").stat().st_size > 0


def test_the_report_names_no_path_of_this_machine(chaos):
    here = str(Path(chaos.__file__).resolve().parent.parent)
    tail = f'File "{here}/areal_hpc/rollout/generator.py", line 1\n{sys.base_prefix}/lib/python3.11/x.py: warning'
    assert chaos.portable(tail) == 'File "areal_hpc/rollout/generator.py", line 1\n<python>/lib/python3.11/x.py: warning'
