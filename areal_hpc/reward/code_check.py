"""Code reward: the program in a response, run in the sandbox, judged case by case.

The reward is +correct only when every test case passes. By default the run stops at the first
failing case (the reward is already decided); `stop_early=False` runs them all, so `passed`
counts every passing case, which is what a user debugging a reward wants. A case of an
assert-style suite (HumanEval, MBPP) is one assert, or a whole HumanEval check (code_tests.py);
a failed assert is a wrong answer, named by its line. A VerdictMemo gives a program already
run against the same tests its verdict again without running it.
"""

from __future__ import annotations

import hashlib
import json
import signal
from collections import OrderedDict

from areal_hpc.config.schema import RewardConfig
from areal_hpc.reward.code_extract import extract_code
from areal_hpc.reward.code_tests import TestSuite
from areal_hpc.reward.compare import return_matches, shorten, stdout_matches
from areal_hpc.reward.sandbox import CaseRun, RunResult, Sandbox
from areal_hpc.reward.task import CodeTask, Verdict


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _failed_assert(output: str) -> str | None:
    """The reason of an assert of the test that failed, from the harness's record of it."""
    try:
        record = json.loads(output)
        line, message = str(record["assert"]), str(record["message"])
    except (json.JSONDecodeError, TypeError, KeyError):
        return None
    return f"wrong answer: {shorten(line)}" + (f" ({shorten(message)})" if message else "")


def judge_case(case: CaseRun, expected: object, kind: str, per_test_timeout_s: float) -> str | None:
    """Why a case of a `kind` suite (TestSuite.kind) failed, or None if it passed."""
    if case.timed_out:
        return f"time limit of {per_test_timeout_s:g} s exceeded"
    if case.truncated or case.signal == signal.SIGXFSZ:
        return "output limit exceeded"
    if case.signal == signal.SIGXCPU:
        return "CPU time limit exceeded"
    if case.signal is not None:
        return f"killed by {signal.Signals(case.signal).name}"
    if case.exit != 0:
        failed = _failed_assert(case.output) if kind == "assert" else None
        if failed is not None:
            return failed
        detail = _last_line(case.stderr)
        return f"runtime error: {shorten(detail)}" if detail else f"exit status {case.exit}"
    if case.strays:
        return "left processes running after it exited"
    if kind == "assert":
        return None if case.finished else "the program exited before its tests ran to the end"
    if kind == "call":
        try:
            value = json.loads(case.output)
        except json.JSONDecodeError:
            return "the return value could not be read back"
        if not return_matches(value, expected):
            return f"wrong answer: expected {shorten(expected)}, got {shorten(value)}"
    elif not stdout_matches(case.output, str(expected)):
        return f"wrong answer: expected {shorten(str(expected).strip())!r}, got {shorten(case.output.strip())!r}"
    return None


class VerdictMemo:
    """The verdicts of the last `size` programs run against the same tests, least recently used
    forgotten first. Only runs that ended cleanly are kept (no time limit, signal, memory kill or
    harness error): those can depend on the machine's load, and run again."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.hits = 0
        self._verdicts: OrderedDict[bytes, Verdict] = OrderedDict()

    @staticmethod
    def key(program: str, suite: TestSuite, stop_early: bool) -> bytes:
        return hashlib.sha256(f"{stop_early}\0{program}\0{suite!r}".encode()).digest()

    def get(self, key: bytes) -> Verdict | None:
        verdict = self._verdicts.get(key)
        if verdict is not None:
            self._verdicts.move_to_end(key)
            self.hits += 1
        return verdict

    def put(self, key: bytes, verdict: Verdict) -> None:
        if self.size <= 0:
            return
        self._verdicts[key] = verdict
        self._verdicts.move_to_end(key)
        while len(self._verdicts) > self.size:
            self._verdicts.popitem(last=False)

    def __len__(self) -> int:
        return len(self._verdicts)


def _ended_cleanly(result: RunResult) -> bool:
    return (result.error is None and not result.oom_kills
            and not any(c.timed_out or c.signal is not None for c in result.cases))


def check_code(task: CodeTask, config: RewardConfig, sandbox: Sandbox, stop_early: bool = True,
               memo: VerdictMemo | None = None) -> Verdict:
    """Score one response: +correct if its program passes every test case, else wrong. With a
    memo, a program it holds a verdict for against these tests is not run again."""
    suite: TestSuite = task.tests
    program = extract_code(task.response)
    if not program.strip():
        return Verdict(config.wrong, 0, len(suite.cases), "no program in the response")
    if memo is None:
        return _run_and_judge(program, suite, config, sandbox, stop_early)[0]
    key = memo.key(program, suite, stop_early)
    if (known := memo.get(key)) is not None:
        return known
    verdict, result = _run_and_judge(program, suite, config, sandbox, stop_early)
    if _ended_cleanly(result):
        memo.put(key, verdict)
    return verdict


def _run_and_judge(program: str, suite: TestSuite, config: RewardConfig, sandbox: Sandbox,
                   stop_early: bool) -> tuple[Verdict, RunResult]:
    total = len(suite.cases)
    failures: list[str] = []

    def keep_going(case: CaseRun) -> bool:
        why = judge_case(case, suite.cases[case.index].expected, suite.kind, config.code.per_test_timeout_s)
        if why is not None:
            failures.append(f"test {case.index + 1}/{total}: {why}")
        return why is None or not stop_early

    result = sandbox.run(program, suite, keep_going)
    if not result.started:
        return Verdict(config.wrong, 0, total, str(result.error), infra=True), result
    passed = len(result.cases) - len(failures)
    if result.oom_kills:
        # Over the limit as a whole, whatever it printed: a judge's memory-limit verdict. (The
        # killed process's case says only SIGKILL, or the harness died with it.)
        return Verdict(config.wrong, passed, total, f"memory limit of {config.code.memory_mb} MB for the run"
                       f" exceeded (its memory cgroup stopped {result.oom_kills} process(es))"), result
    if passed == total:
        return Verdict(config.correct, passed, total, f"passed {total}/{total} tests", correct=True), result
    reason = failures[0] if failures else f"test {len(result.cases) + 1}/{total}: {result.error}"
    return Verdict(config.wrong, passed, total, reason), result
