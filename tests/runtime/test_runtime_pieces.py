"""Small pure pieces of the runtime: failure reasons, reward tasks, faults."""

from __future__ import annotations

import os

import pytest

from areal_hpc.reward.code_tests import parse_tests
from areal_hpc.reward.task import CodeReference, CodeTask, MathReference, MathTask
from areal_hpc.runtime import fault
from areal_hpc.runtime.failure import describe, reason_of
from areal_hpc.wire.layout import Role
from areal_hpc.wire.messages import WorkerFailed


def test_failure_reason_names_the_exception_and_where():
    try:
        raise ValueError("bad batch")
    except ValueError as e:
        reason = reason_of(e)
    assert reason.startswith("ValueError: bad batch (at test_runtime_pieces.py:")
    assert describe(WorkerFailed(2, Role.GENERATOR, 0, reason)).startswith("rank 2 (generator 0) failed: ValueError")


def test_reward_task_from_a_reference_reuses_its_parsed_tests():
    assert MathReference("42").task("so \\boxed{42}") == MathTask("so \\boxed{42}", "42")
    reference = CodeReference(parse_tests({"inputs": ["1\n"], "outputs": ["1\n"]}))
    task = reference.task("print(input())")
    assert task == CodeTask("print(input())", reference.tests) and task.tests is reference.tests


def test_fault_injection_only_where_asked(monkeypatch):
    fault.check("trainer", 0, "step")  # unset: nothing happens
    monkeypatch.setenv(fault.ENV, "trainer:0:step")
    fault.check("trainer", 1, "step")
    fault.check("generator", 0, "step")
    with pytest.raises(fault.InjectedFault):
        fault.check("trainer", 0, "step")
    assert fault.requested("trainer", 0, "step") and not fault.requested("trainer", 0, "join")
    monkeypatch.setenv(fault.ENV, "trainer:0:step:stall")
    assert not fault.requested("trainer", 0, "step")


def test_a_fault_at_the_nth_time_of_its_event_waits_for_it(monkeypatch):
    monkeypatch.setenv(fault.ENV, "generator:1:count-me@3")
    fault.check("generator", 1, "count-me")
    fault.check("generator", 0, "count-me")  # another rank's count is its own
    fault.check("generator", 1, "count-me")
    with pytest.raises(fault.InjectedFault):
        fault.check("generator", 1, "count-me")
    fault.check("generator", 1, "count-me")  # the 4th time: past it
    assert fault.parse("generator:1:update@6:kill") == fault.Fault("generator:1:update", 6, "kill")
    assert fault.parse("trainer:0:step") == fault.Fault("trainer:0:step", None, "raise")


def test_several_faults_each_fire_on_their_own_rank(monkeypatch):
    monkeypatch.setenv(fault.ENV, "generator:1:request@2,generator:2:request:kill")
    assert fault.parse_all(os.environ[fault.ENV])[1] == fault.Fault("generator:2:request", None, "kill")
    fault.check("generator", 1, "request")
    with pytest.raises(fault.InjectedFault):
        fault.check("generator", 1, "request")
    monkeypatch.setenv(fault.ENV, "generator:1:request,trainer:0")
    with pytest.raises(ValueError, match="'trainer:0'"):
        fault.check("generator", 1, "request")


@pytest.mark.parametrize("spec", ["trainer:0", "trainer:x:step", "trainer:0:step:explode", "trainer:0:step@0",
                                  "trainer:0:step@x:kill"])
def test_a_malformed_fault_is_named_not_ignored(spec):
    with pytest.raises(ValueError, match="AREAL_HPC_FAULT="):
        fault.parse(spec)


def test_a_kill_fault_dies_by_sigkill_as_the_oom_killer_kills():
    import signal
    import subprocess
    import sys

    code = "from areal_hpc.runtime import fault\nfault.check('generator', 1, 'request')\nprint('survived')"
    env = {**os.environ, fault.ENV: "generator:1:request:kill"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL and "survived" not in proc.stdout


def test_cpu_engines_take_cores_in_turn_unless_the_user_binds(monkeypatch):
    from areal_hpc.rollout.generator import CPU_BIND_ENV, cpu_bind_for

    monkeypatch.delenv(CPU_BIND_ENV, raising=False)
    cores = sorted(os.sched_getaffinity(0))
    assert [cpu_bind_for(i) for i in range(2 * len(cores))] == [str(c) for c in cores * 2]
    assert cpu_bind_for(None) == "nobind"  # a spare, whose core is the lost generator's
    monkeypatch.setenv(CPU_BIND_ENV, "0-1")
    assert cpu_bind_for(0) is None


def test_a_spare_waits_for_its_own_runs_join_file_only(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """`launch --spare`: a join file another run left (a crashed run's, another AREAL_RUN_ID) is
    not this run's; with none of its own within startup_timeout_s the spare says so and exits 1."""
    import json
    import time

    from areal_hpc.runtime.replacements import JOIN_FILE, RUN_ID_ENV
    from areal_hpc.runtime.world import run_spare

    (tmp_path / JOIN_FILE).write_text(json.dumps({"address": ["127.0.0.1", 9], "secret": "s", "run": "41.0"}))
    monkeypatch.setenv(RUN_ID_ENV, "42.0")
    start = time.monotonic()
    code = run_spare("configs/experiments/tiny-cpu.yaml",
                     [f"logging.dir={tmp_path}", f"model.path={tiny_model_dir}", "startup_timeout_s=2"])
    assert code == 1 and time.monotonic() - start >= 2
    assert f"no {tmp_path / JOIN_FILE} of run 42.0 within startup_timeout_s = 2 s" in capsys.readouterr().err
    assert run_spare("configs/experiments/tiny-cpu.yaml", ["rollout.eta=-1"]) == 2
    assert "error: spare: " in capsys.readouterr().err
