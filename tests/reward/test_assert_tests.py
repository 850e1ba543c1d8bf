"""Assert-style code tests (HumanEval's check(candidate), MBPP's test_list): parsing, and running
through each sandbox backend. The hostile programs run through this path in test_hostile.py."""

from __future__ import annotations

import json
import time

import pytest
from sandbox_support import reward_config, sandbox_processes

from areal_hpc.reward.code_check import check_code
from areal_hpc.reward.code_tests import TestFormatError, TestSuite, parse_tests
from areal_hpc.reward.sandbox import Sandbox
from areal_hpc.reward.task import CodeTask, Verdict, task_from_json, task_to_json

# A HumanEval-shaped problem: module-level data, a docstring, three asserts and one that checks nothing.
HUMANEVAL = {
    "test": (
        "LIMIT = 10\n\n\n"
        "def check(candidate):\n"
        "    \"\"\"Clamped sums.\"\"\"\n"
        "    assert candidate(1, 2) == 3\n"
        "    assert candidate(-4, 4) == 0, 'opposites cancel'\n"
        "    assert candidate(9, 9) == LIMIT\n"
        "    assert True, 'reached the end'\n"
    ),
    "entry_point": "clamped_sum",
}
# A check with a loop and a helper variable: one case.
HUMANEVAL_LOOP = {
    "test": (
        "def check(candidate):\n"
        "    pairs = [(a, b) for a in range(-3, 4) for b in range(-3, 4)]\n"
        "    for a, b in pairs:\n"
        "        assert candidate(a, b) == min(a + b, 10)\n"
    ),
    "entry_point": "clamped_sum",
}
MBPP = {
    "test_list": ["assert clamped_sum(1, 2) == 3", "assert clamped_sum(-4, 4) == 0",
                  "assert clamped_sum(9, 9) == CAP"],
    "test_setup_code": "CAP = 10",
}
CORRECT = "def clamped_sum(a, b):\n    return min(a + b, 10)\n"
NO_CLAMP = "def clamped_sum(a, b):\n    return a + b\n"


# --- parsing --------------------------------------------------------------------------------------


def test_humaneval_check_of_asserts_is_one_case_per_assert() -> None:
    suite = parse_tests(HUMANEVAL)
    assert suite.kind == "assert" and len(suite.cases) == 3  # `assert True` checks nothing
    assert all(c.expected is None and c.input.rstrip().endswith("check(clamped_sum)") for c in suite.cases)
    assert "candidate(-4, 4) == 0" in suite.cases[1].input and "candidate(1, 2)" not in suite.cases[1].input
    assert "LIMIT = 10" in suite.cases[2].input


def test_humaneval_check_with_other_statements_is_one_case() -> None:
    suite = parse_tests(HUMANEVAL_LOOP)
    assert len(suite.cases) == 1 and suite.cases[0].input.startswith(HUMANEVAL_LOOP["test"])


def test_mbpp_one_case_per_line_after_the_setup() -> None:
    suite = parse_tests(json.dumps(MBPP))
    assert suite.kind == "assert"
    assert [c.input for c in suite.cases] == [f"CAP = 10\n{line}\n" for line in MBPP["test_list"]]
    assert [c.input for c in parse_tests({"test_list": ["assert f()"]}).cases] == ["assert f()\n"]


@pytest.mark.parametrize("obj", [HUMANEVAL, HUMANEVAL_LOOP, MBPP])
def test_assert_suites_round_trip_through_json(obj: dict) -> None:
    suite = parse_tests(obj)
    assert TestSuite.from_json(json.loads(json.dumps(suite.to_json()))) == suite
    task = CodeTask(CORRECT, suite)
    assert task_from_json(json.loads(json.dumps(task_to_json(task)))) == task


@pytest.mark.parametrize(
    "obj, problem",
    [
        ({"test": "def check(candidate):\n    assert candidate()\n"}, "missing key 'entry_point'"),
        ({"test": "def check(c):\n    assert c()\n", "entry_point": "no good"}, "'entry_point' must be a Python identifier"),
        ({"test": 42, "entry_point": "f"}, "'test': expected Python source (a string), got int"),
        ({"test": "def check(candidate):\n    assert (\n", "entry_point": "f"}, "'test': not valid Python"),
        ({"test": "def verify(candidate):\n    assert candidate()\n", "entry_point": "f"}, "defines no check(candidate)"),
        ({"test": "def check():\n    assert True\n", "entry_point": "f"}, "defines no check(candidate)"),
        ({"test_list": "assert f() == 1"}, "'test_list' must be a list of assert lines"),
        ({"test_list": []}, "no test cases"),
        ({"test_list": ["assert f() == 1", "f()"]}, "test_list[1]: expected assert statements, got 'f()'"),
        ({"test_list": ["assert f() =="]}, "test_list[0]: not valid Python"),
        ({"test_list": [7]}, "test_list[0]: expected Python source (a string), got int"),
        ({"test_list": ["assert f()"], "test_setup_code": "import (x"}, "'test_setup_code': not valid Python"),
        ({"tests": []}, "expected 'inputs' and 'outputs' (APPS, TACO, LiveCodeBench), 'test' and 'entry_point'"),
    ],
)
def test_bad_assert_tests_name_the_problem(obj: object, problem: str) -> None:
    with pytest.raises(TestFormatError) as info:
        parse_tests(obj, "row 7")
    assert str(info.value).startswith("row 7: ") and problem in str(info.value)


# --- running in the sandbox -------------------------------------------------------------------------


def score(sandbox: Sandbox, program: str, tests: dict, stop_early: bool = True) -> Verdict:
    config = reward_config(sandbox.backend)
    return check_code(CodeTask(program, parse_tests(tests)), config, sandbox, stop_early=stop_early)


@pytest.mark.parametrize("tests, cases", [(HUMANEVAL, 3), (HUMANEVAL_LOOP, 1), (MBPP, 3)])
def test_correct_program_passes(sandbox: Sandbox, tests: dict, cases: int) -> None:
    response = f"Clamp the sum:\n```python\n{CORRECT}```\n"
    assert score(sandbox, response, tests) == Verdict(5.0, cases, cases, f"passed {cases}/{cases} tests", correct=True)
    assert not sandbox_processes()


def test_main_guard_and_printing_do_not_matter(sandbox: Sandbox) -> None:
    program = CORRECT + "print('noise')\nif __name__ == '__main__':\n    print(clamped_sum(int(input()), 1))\n"
    assert score(sandbox, program, MBPP).reward == 5.0


def test_failed_assert_is_a_wrong_answer_named_by_its_line(sandbox: Sandbox) -> None:
    humaneval = score(sandbox, NO_CLAMP, HUMANEVAL, stop_early=False)
    assert (humaneval.reward, humaneval.passed, humaneval.total) == (-5.0, 2, 3)
    assert humaneval.reason == "test 3/3: wrong answer: assert candidate(9, 9) == LIMIT"
    mbpp = score(sandbox, "def clamped_sum(a, b):\n    return 3\n", MBPP)
    assert (mbpp.passed, mbpp.total) == (1, 3)  # stopped at the first failing case
    assert mbpp.reason == "test 2/3: wrong answer: assert clamped_sum(-4, 4) == 0"
    message = score(sandbox, "def clamped_sum(a, b):\n    return a + b if a > 0 else 1\n", HUMANEVAL)
    assert message.reason == "test 2/3: wrong answer: assert candidate(-4, 4) == 0, 'opposites cancel' (opposites cancel)"
    loop = score(sandbox, "def clamped_sum(a, b):\n    return a - b\n", HUMANEVAL_LOOP)
    assert (loop.passed, loop.total) == (0, 1) and loop.reason.startswith("test 1/1: wrong answer: assert candidate(a, b)")


def test_crashes_fail_as_runtime_errors(sandbox: Sandbox) -> None:
    crash = score(sandbox, "def clamped_sum(a, b):\n    return a // (b - 2)\n", MBPP)
    assert crash.reward == -5.0 and crash.reason == "test 1/3: runtime error: ZeroDivisionError: integer division or modulo by zero"
    own_assert = score(sandbox, "def clamped_sum(a, b):\n    assert a > 0\n    return min(a + b, 10)\n", MBPP)
    assert own_assert.reason == "test 2/3: runtime error: AssertionError"  # the program's assert, not the test's
    missing = score(sandbox, "def other(a, b):\n    return 0\n", HUMANEVAL)
    assert "runtime error: NameError: name 'clamped_sum' is not defined" in missing.reason
    syntax = score(sandbox, "def clamped_sum(a, b):\n    return (\n", MBPP)
    assert syntax.reward == -5.0 and "SyntaxError" in syntax.reason and "<program>" in syntax.reason


def test_time_limit(sandbox: Sandbox) -> None:
    start = time.monotonic()
    verdict = score(sandbox, "import time\ndef clamped_sum(a, b):\n    time.sleep(30)\n", HUMANEVAL)
    assert verdict.reward == -5.0 and verdict.reason == "test 1/3: time limit of 2 s exceeded"
    assert time.monotonic() - start < 10
    spin = score(sandbox, "def clamped_sum(a, b):\n    while True:\n        pass\n", HUMANEVAL_LOOP)
    assert "limit" in spin.reason


@pytest.mark.parametrize("exit_line", ["raise SystemExit(0)", "import sys; sys.exit()", "import os; os._exit(0)",
                                       "import os; os.write(3, b'0' * 32); os._exit(0)"])
def test_exiting_before_the_asserts_ran_fails(sandbox: Sandbox, exit_line: str) -> None:
    for where in (CORRECT + exit_line + "\n",  # at import, before any assert
                  CORRECT.replace("    return", f"    {exit_line}\n    return")):  # inside the call
        verdict = score(sandbox, where, MBPP)
        assert verdict.reward == -5.0 and verdict.reason == "test 1/3: the program exited before its tests ran to the end"


def test_printing_past_the_output_limit_fails(sandbox: Sandbox) -> None:
    program = CORRECT.replace("    return", "    print('x' * (1 << 20))\n    return")
    assert score(sandbox, program, MBPP).reason == "test 1/3: output limit exceeded"
