"""Code reward through each sandbox backend: passes, failures of every kind, limits, formats."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time

import psutil
import pytest
from sandbox_support import reward_config, sandbox_processes

from areal_hpc.reward import launcher
from areal_hpc.reward.code_check import VerdictMemo, check_code
from areal_hpc.reward.code_tests import parse_tests
from areal_hpc.reward.sandbox import WORKDIR_PREFIX, Sandbox
from areal_hpc.reward.task import CodeTask, Verdict

ADD = parse_tests({"inputs": ["1 2\n", "3 4\n", "-5 5\n"], "outputs": ["3\n", "7\n", "0\n"]})
ADD_PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"


def score(sandbox: Sandbox, program: str, tests=ADD, stop_early: bool = True, **limits) -> Verdict:
    config = reward_config(sandbox.backend, **limits)
    if limits:
        sandbox = Sandbox(sandbox.backend, sandbox.python, config.code)
    return check_code(CodeTask(program, tests), config, sandbox, stop_early=stop_early)


def test_correct_solution_passes(sandbox: Sandbox) -> None:
    response = f"Here is my solution:\n```python\n{ADD_PROGRAM}```\nIt reads two numbers."
    assert score(sandbox, response) == Verdict(5.0, 3, 3, "passed 3/3 tests", correct=True)
    assert not sandbox_processes()


def test_call_tests_function_and_solution_class(sandbox: Sandbox) -> None:
    tests = parse_tests({"fn_name": "two_sum", "inputs": [[[2, 7, 11], 9], [[3, 3], 6]],
                         "outputs": [[[0, 1]], [0, 1]]})
    function = "def two_sum(nums, target):\n    seen = {}\n    for i, x in enumerate(nums):\n" \
               "        if target - x in seen:\n            return (seen[target - x], i)\n        seen[x] = i\n"
    method = "class Solution:\n    def two_sum(self, nums, target):\n        return [0, 1]\n"
    assert score(sandbox, function, tests).reward == 5.0
    assert score(sandbox, method, tests).reward == 5.0
    missing = score(sandbox, "def other(): pass\n", tests)
    assert missing.reward == -5.0 and "defines neither two_sum() nor Solution.two_sum()" in missing.reason


def test_wrong_answer_fails_and_stops_early(sandbox: Sandbox) -> None:
    verdict = score(sandbox, "print(3)\n")
    assert (verdict.reward, verdict.passed, verdict.total) == (-5.0, 1, 3)
    assert verdict.reason == "test 2/3: wrong answer: expected '7', got '3'"
    full = score(sandbox, "print(3)\n", stop_early=False)
    assert (full.passed, full.reason) == (1, verdict.reason)


def test_runtime_and_syntax_errors_fail(sandbox: Sandbox) -> None:
    crash = score(sandbox, "x = int(input().split()[0])\nprint(1 // (x - 1))\n")
    assert crash.reward == -5.0 and "runtime error: ZeroDivisionError" in crash.reason
    syntax = score(sandbox, "print(\n")
    assert syntax.reward == -5.0 and "SyntaxError" in syntax.reason
    exits = score(sandbox, "import sys\nsys.exit(3)\n")
    assert exits.reward == -5.0 and "exit status 1" in exits.reason


def test_sys_exit_zero_after_correct_output_passes(sandbox: Sandbox) -> None:
    assert score(sandbox, ADD_PROGRAM + "raise SystemExit(0)\n").reward == 5.0


def test_time_limits(sandbox: Sandbox) -> None:
    start = time.monotonic()
    verdict = score(sandbox, "import time\ntime.sleep(30)\n")
    assert verdict.reward == -5.0 and "time limit of 2 s exceeded" in verdict.reason
    assert time.monotonic() - start < 10
    slow = "import time\ntime.sleep(0.7)\n" + ADD_PROGRAM
    total = score(sandbox, slow, total_timeout_s=1.5)
    assert total.reward == -5.0 and "total time limit of 1.5 s exceeded" in total.reason, total


def test_working_directory_is_fresh_and_writable(sandbox: Sandbox) -> None:
    program = "import os\nseen = os.listdir('.')\nopen('note.txt', 'w').write('x')\n" \
              "assert open('note.txt').read() == 'x'\nprint(len(seen))\n"
    tests = parse_tests({"inputs": [""], "outputs": ["0"]})
    for _ in range(2):  # the second run does not see the first run's file
        verdict = score(sandbox, program, tests)
        assert verdict.reward == 5.0, verdict


def test_large_input_and_binary_output(sandbox: Sandbox) -> None:
    numbers = " ".join(str(i) for i in range(200_000))
    tests = parse_tests({"inputs": [numbers + "\n"], "outputs": [str(sum(range(200_000)))]})
    assert score(sandbox, "print(sum(map(int, input().split())))\n", tests).reward == 5.0
    garbage = score(sandbox, "import sys\nsys.stdout.buffer.write(bytes(range(256)))\n")
    assert garbage.reward == -5.0 and "wrong answer" in garbage.reason


def test_environment_is_replaced(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AREAL_SECRET_TOKEN", "leak")
    tests = parse_tests({"inputs": [""], "outputs": ["None"]})
    assert score(sandbox, "import os\nprint(os.environ.get('AREAL_SECRET_TOKEN'))\n", tests).reward == 5.0


def test_working_directories_of_killed_runs_are_removed(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = tmp_path / f"{WORKDIR_PREFIX}{dead.pid}-x1"
    alive = tmp_path / f"{WORKDIR_PREFIX}{os.getpid()}-x2"
    for d in (orphan, alive):
        (d / "sub").mkdir(parents=True)
    Sandbox("rlimits", "/usr/bin/python3", reward_config("rlimits").code)
    assert not orphan.exists() and alive.exists()


def test_auto_refuses_a_weaker_sandbox_unless_it_is_named(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No bwrap on the PATH (as on a machine without the package): `auto` does not fall back to a
    weaker sandbox; naming one in the config uses it."""
    from areal_hpc.config.schema import CodeSandboxConfig
    from areal_hpc.reward.sandbox import SandboxUnavailable

    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no bwrap, no unshare
    with pytest.raises(SandboxUnavailable, match="the bwrap sandbox cannot run here .*bwrap is not installed.*"
                                                 "set reward.code.backend to unshare or rlimits"):
        Sandbox.detect(CodeSandboxConfig(backend="auto"))
    assert Sandbox.detect(CodeSandboxConfig(backend="rlimits")).backend == "rlimits"


def test_descendants_are_the_whole_subtree_and_match_psutil() -> None:
    """The stray sweep's subtree walk finds grandchildren (a double fork) as psutil's scan does."""
    from areal_hpc.reward.sandbox import _descendants

    parent = subprocess.Popen(["/bin/sh", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 10
        while len(psutil.Process(parent.pid).children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        below = _descendants(os.getpid())
        assert {parent.pid} | {c.pid for c in psutil.Process(parent.pid).children()} <= below
        assert below == {p.pid for p in psutil.Process().children(recursive=True)}
    finally:
        for child in psutil.Process(parent.pid).children():
            child.kill()
        parent.kill()
        parent.wait()


class CountingSandbox(Sandbox):
    """The real sandbox, counting its runs."""

    runs = 0

    def run(self, *args, **kwargs):
        self.runs += 1
        return super().run(*args, **kwargs)


def test_a_program_already_judged_is_not_run_again(sandbox: Sandbox) -> None:
    config = reward_config(sandbox.backend, per_test_timeout_s=0.5)
    counting = CountingSandbox(sandbox.backend, sandbox.python, config.code)
    memo = VerdictMemo(8)

    def judge(response: str, tests=ADD):
        return check_code(CodeTask(response, tests), config, counting, memo=memo)

    first = judge(ADD_PROGRAM)
    # The same program in other words around it, then with other tests, then a wrong one twice.
    assert judge(f"Sure:\n```python\n{ADD_PROGRAM}```\nDone.") == first and first.correct
    assert (counting.runs, memo.hits) == (1, 1)
    other = parse_tests({"inputs": ["1 2\n"], "outputs": ["4\n"]})
    assert not judge(ADD_PROGRAM, other).correct and counting.runs == 2
    wrong = "print(0)\n"
    assert judge(wrong) == judge(wrong) and counting.runs == 3
    # A run that hit a time limit may depend on the machine's load: it runs again.
    slow = "while True:\n    pass\n"
    assert "time limit" in judge(slow).reason and "time limit" in judge(slow).reason
    assert counting.runs == 5 and len(memo) == 3


def test_the_memo_forgets_the_least_recently_used_and_zero_keeps_none(sandbox: Sandbox) -> None:
    config = reward_config(sandbox.backend)
    for size, runs in ((1, 3), (2, 2), (0, 3)):
        counting = CountingSandbox(sandbox.backend, sandbox.python, config.code)
        memo = VerdictMemo(size)
        for program in (ADD_PROGRAM, "print(0)\n", ADD_PROGRAM):
            check_code(CodeTask(program, ADD), config, counting, memo=memo)
        assert counting.runs == runs and len(memo) == min(size, 2), size


def test_a_reward_worker_judges_a_repeated_program_once(sandbox: Sandbox) -> None:
    """The worker's scorer keeps reward.code.reuse_verdicts verdicts; 0 turns the memo off."""
    from areal_hpc.reward.worker import Scorer

    for keep, hits in ((16, 2), (0, 0)):
        scorer = Scorer(reward_config(sandbox.backend, reuse_verdicts=keep))
        verdicts = [scorer.score(CodeTask(ADD_PROGRAM, ADD)) for _ in range(3)]
        assert all(v.correct for v in verdicts) and scorer.memo.hits == hits


def test_a_killed_spawner_is_started_again(sandbox: Sandbox) -> None:
    """Runs start from the sandbox's spawner process; if it dies between runs, the next run starts
    a new one and is judged as usual."""
    assert score(sandbox, ADD_PROGRAM).correct
    first = sandbox.launcher.proc
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    assert score(sandbox, ADD_PROGRAM).correct
    spawner = sandbox.launcher.proc.pid
    assert spawner != first.pid and not psutil.Process(spawner).children()  # the run left nothing


def test_a_hung_spawner_fails_the_run_as_the_service_s_fault_and_is_replaced(
        sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stopped spawner: the run is reported as an infrastructure failure (left out of training,
    not scored wrong), the spawner is killed, and the next run gets a new one."""
    monkeypatch.setattr(launcher, "ANSWER_TIMEOUT_S", 0.5)
    assert score(sandbox, ADD_PROGRAM).correct
    stopped = sandbox.launcher.proc
    stopped.send_signal(signal.SIGSTOP)
    verdict = score(sandbox, ADD_PROGRAM)
    assert verdict.infra and not verdict.correct, verdict
    assert "the sandbox could not start: the spawner did not answer within 0.5 s" in verdict.reason
    assert stopped.poll() is not None  # killed and reaped
    assert score(sandbox, ADD_PROGRAM).correct
