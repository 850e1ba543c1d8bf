"""The asynchronous pool: concurrency, ordering, backpressure, timeouts, worker deaths, shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from contextlib import suppress

import psutil
import pytest
from sandbox_support import LIMITS, run_processes, sandbox_processes

from areal_hpc.config.schema import CodeSandboxConfig, RewardConfig
from areal_hpc.reward.code_tests import parse_tests
from areal_hpc.reward.pool import RewardPool
from areal_hpc.reward.sandbox import SandboxUnavailable
from areal_hpc.reward.task import CodeTask, MathTask, Verdict

ADD = parse_tests({"inputs": ["1 2\n"], "outputs": ["3\n"]})
SLOW_ADD = "import time\ntime.sleep({s})\na, b = map(int, input().split())\nprint(a + b)\n"
CONFIG = RewardConfig(kind="code", workers=2, max_pending=2, timeout_s=5.0, code=CodeSandboxConfig(**LIMITS))


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[asyncio.Runner, RewardPool]]:
    runner = asyncio.Runner()
    pool = runner.run(RewardPool(CONFIG, grace_s=2.0).start())
    try:
        yield runner, pool
    finally:
        runner.run(pool.close())
        runner.close()


def test_concurrent_math_and_code_verdicts_match_their_tasks(served) -> None:
    runner, pool = served
    tasks = []
    for i in range(30):
        tasks.append((MathTask(f"so \\boxed{{{i}}}", str(i if i % 3 else i + 1)), i % 3 != 0))
    tasks.append((CodeTask("print(3)", ADD), True))
    tasks.append((CodeTask("print(4)", ADD), False))

    async def all_of_them() -> list[Verdict]:
        return await asyncio.gather(*(pool.score(t) for t, _ in tasks))

    verdicts = runner.run(all_of_them())
    assert [v.reward > 0 for v in verdicts] == [ok for _, ok in tasks]
    assert "sandbox" in pool.backend


def test_backpressure_blocks_callers_beyond_max_pending(served) -> None:
    runner, pool = served

    async def flood() -> list[Verdict]:
        # Distinct programs: copies of one program on one prompt's tests would share one run.
        calls = [asyncio.create_task(pool.score(CodeTask(SLOW_ADD.format(s=0.4) + f"# {i}\n", ADD)))
                 for i in range(7)]
        await asyncio.sleep(0.2)
        # two tasks run on the two workers, two wait in the queue, three callers are held back
        assert pool.pending() == CONFIG.max_pending
        assert not any(c.done() for c in calls)
        return await asyncio.gather(*calls)

    assert all(v.reward == CONFIG.correct for v in runner.run(flood()))
    assert pool.pending() == 0


def test_a_cancelled_caller_does_not_disturb_the_pool(served) -> None:
    runner, pool = served

    async def give_up_then_score() -> Verdict:
        waiting = asyncio.create_task(pool.score(CodeTask(SLOW_ADD.format(s=0.5), ADD)))
        await asyncio.sleep(0.1)
        waiting.cancel()
        return await pool.score(MathTask("\\boxed{2}", "2"))

    assert runner.run(give_up_then_score()).reward == CONFIG.correct


def _pids(pool: RewardPool) -> list[int]:
    return [p for p in pool.worker_pids() if p is not None]


def test_an_unresponsive_worker_is_killed_and_replaced(served) -> None:
    runner, pool = served
    stuck = _pids(pool)
    for pid in stuck:
        os.kill(pid, signal.SIGSTOP)
    start = time.monotonic()
    verdict = runner.run(pool.score(MathTask("\\boxed{2}", "2")))
    assert verdict.reward == CONFIG.wrong and "timed out after 7 s (worker restarted)" in verdict.reason
    assert verdict.infra  # the service's failure, not the response's: left out of training
    assert time.monotonic() - start < 20
    assert pool.timeouts == 1
    killed = [p for p in stuck if p not in _pids(pool)]
    assert len(killed) == 1 and not psutil.pid_exists(killed[0])
    for pid in _pids(pool):
        os.kill(pid, signal.SIGCONT)  # the other worker never got a task; let it serve again
    assert runner.run(pool.score(MathTask("\\boxed{2}", "2"))).reward == CONFIG.correct


async def _busy_worker(pool: RewardPool, exclude: set[int] = frozenset()) -> int:
    """The pid of a worker (not in `exclude`) that is running a sandbox, once there is one."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for pid in set(_pids(pool)) - exclude:
            with suppress(psutil.NoSuchProcess):
                if run_processes(pid):
                    return pid
        await asyncio.sleep(0.05)
    raise AssertionError("no worker started the task")


def test_a_task_is_retried_when_its_worker_dies(served) -> None:
    runner, pool = served

    async def kill_one_under_task() -> Verdict:
        restarts = pool.restarts
        scoring = asyncio.create_task(pool.score(CodeTask(SLOW_ADD.format(s=1.5), ADD)))
        os.kill(await _busy_worker(pool), signal.SIGKILL)
        verdict = await scoring
        assert pool.restarts == restarts + 1
        return verdict

    assert runner.run(kill_one_under_task()) == Verdict(CONFIG.correct, 1, 1, "passed 1/1 tests", correct=True)


def test_a_task_whose_worker_keeps_dying_fails_with_a_reason(served) -> None:
    runner, pool = served

    async def kill_twice() -> Verdict:
        scoring = asyncio.create_task(pool.score(CodeTask(SLOW_ADD.format(s=3), ADD)))
        first = await _busy_worker(pool)
        others = set(_pids(pool))
        os.kill(first, signal.SIGKILL)
        os.kill(await _busy_worker(pool, exclude=others), signal.SIGKILL)
        return await scoring

    verdict = runner.run(kill_twice())
    assert verdict.reward == CONFIG.wrong and "died under this task, 2x" in verdict.reason and verdict.infra
    after = runner.run(pool.score(CodeTask("print(1 + 2)", ADD)))
    assert after.reward == CONFIG.correct and not after.infra
    # The service's failure was not kept for copies: this one runs, into the 2 s per-test limit.
    again = runner.run(pool.score(CodeTask(SLOW_ADD.format(s=3), ADD)))
    assert not again.infra and "time limit of 2 s exceeded" in again.reason


def test_copies_of_one_program_on_one_prompts_tests_share_one_run(served) -> None:
    """A group's samples often hold the same program: it runs once per prompt's tests. The same
    program on another prompt's tests, or another program, runs on its own; so does a copy whose
    first sample gave up."""
    runner, pool = served
    tests = parse_tests({"inputs": ["2 2\n"], "outputs": ["4\n"]})
    other = parse_tests({"inputs": ["2 2\n"], "outputs": ["5\n"]})
    program = SLOW_ADD.format(s=0.5)

    async def group() -> tuple[list[Verdict], int, float]:
        shared = pool.shared
        start = time.monotonic()
        verdicts = await asyncio.gather(*(pool.score(CodeTask(f"Here:\n```python\n{program}```\n{i}", tests))
                                          for i in range(6)), pool.score(CodeTask(program, other)))
        return verdicts, pool.shared - shared, time.monotonic() - start

    verdicts, shared, seconds = runner.run(group())
    assert [v.reward for v in verdicts] == [CONFIG.correct] * 6 + [CONFIG.wrong]
    assert shared == 5
    assert seconds < 3 * 0.5 + 2  # 2 runs on 2 workers, not 7 runs

    async def first_gives_up() -> Verdict:
        first = asyncio.create_task(pool.score(CodeTask(SLOW_ADD.format(s=0.6), tests)))
        await asyncio.sleep(0.1)
        copy = asyncio.create_task(pool.score(CodeTask(SLOW_ADD.format(s=0.6), tests)))
        await asyncio.sleep(0.1)
        first.cancel()
        return await copy

    assert runner.run(first_gives_up()).reward == CONFIG.correct


def test_start_fails_when_no_sandbox_works() -> None:
    """An interpreter that exists but cannot run a program fails every backend's probe."""
    config = RewardConfig(kind="code", workers=1, code=CodeSandboxConfig(python="/bin/false"))
    with pytest.raises(SandboxUnavailable, match="the bwrap sandbox cannot run here"):
        asyncio.run(RewardPool(config).start())
    named = RewardConfig(kind="code", workers=1, code=CodeSandboxConfig(backend="rlimits", python="/bin/false"))
    with pytest.raises(SandboxUnavailable, match="no sandbox backend works here: rlimits with /bin/false"):
        asyncio.run(RewardPool(named).start())
    missing = RewardConfig(kind="code", workers=1, code=CodeSandboxConfig(python="/nonexistent/python3"))
    with pytest.raises(SandboxUnavailable, match="'/nonexistent/python3': no executable file there"):
        asyncio.run(RewardPool(missing).start())


def test_close_stops_every_worker(served) -> None:
    """Runs last: closes the module's pool (closing twice is harmless)."""
    runner, pool = served
    pids = _pids(pool)
    runner.run(pool.close())
    for pid in pids:
        assert not psutil.pid_exists(pid)
    assert sandbox_processes() == []
