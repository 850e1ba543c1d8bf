"""Custom reward functions: loading both forms, the verl call, failures as counted failed samples
(in this process and through the pool's workers), and routing by data source."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from areal_hpc.config.schema import RewardConfig
from areal_hpc.reward.custom import (
    FAILED_SCORE,
    CallFailed,
    CustomFunctionError,
    Score,
    call,
    check_custom,
    load_function,
    score_of,
)
from areal_hpc.reward.pool import RewardPool
from areal_hpc.reward.sandbox import SandboxUnavailable
from areal_hpc.reward.task import CustomTask, MathTask, Verdict, kind_of, task_from_json, task_to_json

# One file of functions, each failing (or not) in its own way.
FUNCTIONS = '''
import os
import signal
import time


def exact(data_source, solution_str, ground_truth, extra_info=None):
    hit = solution_str.strip() == ground_truth
    return {"score": 1.0 if hit else 0.0, "chars": len(solution_str), "source_is_mine": data_source == "mine",
            "pred": solution_str, "split": extra_info.get("split", 0)}


def plain(data_source, solution_str, ground_truth, extra_info=None):
    return 5 if ground_truth in solution_str else -5


def raises(data_source, solution_str, ground_truth, extra_info=None):
    raise ValueError("no answer in " + solution_str)


def sleeps(data_source, solution_str, ground_truth, extra_info=None):
    try:
        time.sleep(30)
    except Exception:  # a broad handler must not swallow the timeout
        return 1.0
    return 1.0


def ignores_the_alarm(data_source, solution_str, ground_truth, extra_info=None):
    signal.signal(signal.SIGALRM, signal.SIG_IGN)  # as code blocked in C would: only the pool stops it
    time.sleep(30)
    return 1.0


def exits(data_source, solution_str, ground_truth, extra_info=None):
    os._exit(3)


def text(data_source, solution_str, ground_truth, extra_info=None):
    return "1.0"


def nan(data_source, solution_str, ground_truth, extra_info=None):
    return float("nan")


def no_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"reward": 1.0}


def positional(a, b, c, d):
    return 1.0


def by_mode(data_source, solution_str, ground_truth, extra_info=None):
    """One long-lived pool meets every failure: the row's extra_info says which."""
    mode = extra_info.get("mode")
    if mode == "exit":
        os._exit(3)
    if mode == "hog":  # allocates without bound
        held = []
        while True:
            held.append(bytearray(64 << 20))
    named = {"raise": raises, "sleep": sleeps, "ignore_alarm": ignores_the_alarm, "text": text, "nan": nan}
    return named.get(mode, exact)(data_source, solution_str, ground_truth, extra_info)
'''


@pytest.fixture(scope="module")
def functions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("custom") / "rewards.py"
    path.write_text(FUNCTIONS)
    return path


def task(response: str = "42", ground_truth: str = "42", source: str | None = "mine",
         extra: dict | None = None) -> CustomTask:
    return CustomTask(response, source, ground_truth, {"split": 2} if extra is None else extra)


def test_file_form_is_called_as_verl_calls_it(functions: Path) -> None:
    score = call(load_function(f"{functions}:exact"), task(), 5.0)
    # non-numeric values (the prediction) are dropped; booleans are numbers
    assert score == Score(1.0, True, {"chars": 2.0, "source_is_mine": 1.0, "split": 2.0})


def test_module_form(functions: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(functions.parent))
    assert call(load_function("rewards:plain"), task("so 42"), 5.0) == Score(5.0, True)


@pytest.mark.parametrize("spec, fragment", [
    ("{dir}/missing.py:exact", "cannot import {dir}/missing.py: FileNotFoundError: no file"),
    ("no_such_module_here:exact", "cannot import no_such_module_here: No module named 'no_such_module_here'"
                                  " (a module must be importable from PYTHONPATH"),
    ("{dir}/broken.py:exact", "cannot import {dir}/broken.py: SyntaxError"),
    ("{dir}/rewards.py:exactly", "{dir}/rewards.py defines no function 'exactly'"),
    ("{dir}/rewards.py", "must be module:function or path/to/file.py:function"),
])
def test_a_function_that_does_not_import_is_named(functions: Path, spec: str, fragment: str) -> None:
    (functions.parent / "broken.py").write_text("def exact(:\n")
    spec, fragment = spec.format(dir=functions.parent), fragment.format(dir=functions.parent)
    with pytest.raises(CustomFunctionError) as info:
        load_function(spec)
    assert str(info.value).startswith(f"reward function {spec!r}: ") and fragment in str(info.value)


@pytest.mark.parametrize("name, why", [
    ("raises", "raised ValueError: no answer in 42"),
    ("text", "returned str '1.0', not a finite number or a dict with a 'score'"),
    ("nan", "returned float nan, not a finite number"),
    ("no_score", "returned a dict without 'score' (keys: reward)"),
    ("positional", "raised TypeError: "),
])
def test_a_failing_call_is_a_failed_sample_saying_why(functions: Path, name: str, why: str) -> None:
    spec = f"{functions}:{name}"
    config = RewardConfig(kind="custom", function=spec)
    with pytest.raises(CallFailed, match="^" + why.replace("(", r"\(").replace(")", r"\)")):
        call(load_function(spec), task(), config.timeout_s)
    verdict = check_custom(task(), load_function(spec), config)
    assert (verdict.reward, verdict.passed, verdict.total, verdict.correct) == (FAILED_SCORE, 0, 1, False)
    assert verdict.reason.startswith(f"custom reward function {spec} {why}")


@pytest.mark.parametrize("result, score", [
    (1, Score(1.0, True)), (0, Score(0.0, False)), (True, Score(1.0, True)), (False, Score(0.0, False)),
    (np.bool_(True), Score(1.0, True)), (np.float32(0.5), Score(0.5, False)),
    (-1.0, Score(-1.0, False)), (1.5, Score(1.5, True)),  # DAPO's -1/1; past 1 still correct
    ({"score": 1.0}, Score(1.0, True)),
    # verl's "acc" decides when present, whatever the score's scale (e.g. a shaped reward)
    ({"score": 0.9, "acc": True, "pred": "4"}, Score(0.9, True, {"acc": 1.0})),
    ({"score": 1.0, "acc": False}, Score(1.0, False, {"acc": 0.0})),
    ({"score": 3.0, "acc": 0.0}, Score(3.0, False, {"acc": 0.0})),
])
def test_what_counts_as_correct(result: object, score: Score) -> None:
    assert score_of(result) == score


def test_an_acc_that_is_no_number_fails_the_call() -> None:
    with pytest.raises(CallFailed, match=r"^returned an 'acc' that is not a bool or a finite number: 'yes'$"):
        score_of({"score": 1.0, "acc": "yes"})


def test_a_call_past_the_timeout_fails_quickly(functions: Path) -> None:
    start = time.monotonic()
    with pytest.raises(CallFailed, match=r"^timed out after 0.3 s"):
        call(load_function(f"{functions}:sleeps"), task(), 0.3)
    assert time.monotonic() - start < 2


def test_verdicts_and_tasks_cross_the_process_boundary() -> None:
    t = task()
    assert task_from_json(task_to_json(t)) == t
    v = Verdict(0.5, 0, 1, "score 0.5", {"chars": 3.0})
    assert Verdict.from_json(v.to_json()) == v
    assert "metrics" not in Verdict(5.0, 1, 1, "correct").to_json()  # math and code verdicts unchanged


def test_routing_by_data_source() -> None:
    reward = RewardConfig(kind="math", by_source={"livecodebench": "code", "mine": "custom"})
    assert [kind_of(s, reward) for s in ("livecodebench", "mine", "openai/gsm8k", None)] == \
        ["code", "custom", "math", "math"]
    assert kind_of(None, RewardConfig(kind="custom")) == "custom"


def test_one_pool_survives_every_failure_and_keeps_scoring(functions: Path) -> None:
    """Each failure is one failed sample with its reason; the pool keeps serving math and custom."""
    config = RewardConfig(kind="math", by_source={"mine": "custom"}, function=f"{functions}:by_mode", workers=2,
                          timeout_s=1.0, retries=1, memory_mb=512)
    modes = ["raise", "sleep", "ignore_alarm", "exit", "text", "nan", "hog"]

    async def run() -> tuple[list[Verdict], list[Verdict], str]:
        async with RewardPool(config, grace_s=1.0) as pool:
            failed = await asyncio.gather(*(pool.score(task(extra={"mode": m})) for m in modes))
            after = await asyncio.gather(pool.score(task()), pool.score(task("41")),
                                         pool.score(MathTask("\\boxed{2}", "2")))
            return failed, after, pool.backend

    start = time.monotonic()
    failed, after, backend = asyncio.run(run())
    assert time.monotonic() - start < 60
    assert backend == f"math, custom {config.function} (module _areal_hpc_reward_function_rewards)"
    # The function's own failures score 0 on its scale; those of the service (infra) reward.wrong.
    assert all((v.reward, v.passed, v.total, v.correct) == (config.wrong if v.infra else FAILED_SCORE, 0, 1, False)
               for v in failed), failed
    spec = config.function
    assert [v.reason for v in failed] == [
        f"custom reward function {spec} raised ValueError: no answer in 42",
        f"custom reward function {spec} timed out after 1 s",  # the alarm: the worker lives on
        # the alarm ignored: the pool kills the worker
        f"custom reward function {spec}: scoring timed out after 2 s (worker restarted)",
        f"custom reward function {spec}: the reward worker died under this task, 2x (exit status 3)",
        f"custom reward function {spec} returned str '1.0', not a finite number or a dict with a 'score'",
        f"custom reward function {spec} returned float nan, not a finite number or a dict with a 'score'",
        f"custom reward function {spec} ran out of memory (MemoryError: it allocated past reward.memory_mb)",
    ]
    # The function's own errors are its verdict; a worker the pool had to kill is the service's.
    assert [v.infra for v in failed] == [False, False, True, True, False, False, False]
    assert [(v.reward, v.passed, v.correct) for v in after] == [(1.0, 1, True), (0.0, 0, False), (5.0, 1, True)]
    assert after[0].metrics == {"chars": 2.0, "source_is_mine": 1.0, "split": 2.0}
    assert after[0].reason == f"score 1 from {spec}"


def test_a_worker_refuses_to_start_without_its_function(functions: Path) -> None:
    config = RewardConfig(kind="custom", function=f"{functions}:exactly", workers=1)
    with pytest.raises(SandboxUnavailable, match="defines no function 'exactly'"):
        asyncio.run(RewardPool(config).start())
