"""Reward functions that users bring (reward.function), called as verl calls them.

`function(data_source=..., solution_str=..., ground_truth=..., extra_info=...)` returns the
reward: a number, a bool, or a dict with a "score" whose other numeric values are per-sample
metrics. The score is the reward as is, on the function's own scale (reward.correct and
reward.wrong are the built-in checks' rewards). Whether the response counts as correct (the
accuracy metrics) is judged as verl reads such functions: the dict's "acc" when it has one, else
the score reaching 1 (a bool True, or the top of a 0/1 or -1/1 scale). The
function is the user's own (trusted) code, so it runs unsandboxed, in the reward workers: a slow or
crashing function costs a worker, never the generator. A call is limited to reward.timeout_s by
SIGALRM where it runs on a main thread (the workers, the CLI, preflight); a function the alarm
cannot stop (blocked in C code, or one that cancels the alarm, as math-verify's own timeouts do)
is stopped by the pool, which kills the worker after the limit and its grace.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import numbers
import resource
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np

from areal_hpc.config.schema import RewardConfig
from areal_hpc.config.validate import FUNCTION_FORM
from areal_hpc.errors import UserError
from areal_hpc.reward.compare import shorten
from areal_hpc.reward.task import CustomTask, Verdict

RewardFunction = Callable[..., object]

# The score of a correct response without an "acc" saying so: verl's functions score 0/1 (or -1/1).
CORRECT_SCORE = 1.0
# The reward of a call that gave none (raised, timed out, returned no number): verl's wrong answer.
FAILED_SCORE = 0.0


@dataclass(frozen=True)
class Score:
    """What one call of the function returned."""

    reward: float
    correct: bool
    # The dict's other numeric values ("acc" included), averaged per batch as reward/<key>.
    metrics: dict[str, float] = field(default_factory=dict)


class CustomFunctionError(UserError):
    """reward.function names nothing that can be called."""


class CallFailed(Exception):
    """A call that gave no reward; the message says why."""


class _Timeout(BaseException):
    """Raised into the function by the alarm: not an Exception, so the function's own
    `except Exception` cannot swallow it."""


def _alarm(signum: int, frame: object) -> None:
    raise _Timeout


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise FileNotFoundError(f"no file {path} (relative paths are from {Path.cwd()})")
    # A name of its own, registered before it runs (dataclasses and pickle look modules up there).
    name = f"_areal_hpc_reward_function_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_function(spec: str) -> RewardFunction:
    """The function `spec` names: "module:function" or "path/to/file.py:function"."""
    if not FUNCTION_FORM.fullmatch(spec):
        raise CustomFunctionError(f"reward function {spec!r}: must be module:function"
                                  " or path/to/file.py:function")
    where, _, name = spec.rpartition(":")
    try:
        module = _import_file(Path(where)) if where.endswith(".py") else importlib.import_module(where)
    except ModuleNotFoundError as e:
        hint = " (a module must be importable from PYTHONPATH; or give path/to/file.py:function)"
        raise CustomFunctionError(f"reward function {spec!r}: cannot import {where}: {e}{hint}") from None
    except (Exception, SystemExit) as e:  # importing runs the user's module: anything may go wrong
        raise CustomFunctionError(f"reward function {spec!r}: cannot import {where}:"
                                  f" {type(e).__name__}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise CustomFunctionError(f"reward function {spec!r}: {where} defines no function {name!r}")
    return fn


def _with_deadline(fn: RewardFunction, seconds: float, **kwargs: object) -> object:
    if threading.current_thread() is not threading.main_thread():
        return fn(**kwargs)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn(**kwargs)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)


def _finite(value: object) -> float | None:
    """A number (bools, numpy's included) as a float; None for anything else, or inf and nan."""
    if isinstance(value, numbers.Real | np.bool_) and math.isfinite(value):
        return float(value)
    return None


def _judged(acc: object) -> bool:
    """Whether a returned "acc" says correct: True, or a number reaching CORRECT_SCORE."""
    value = _finite(acc)
    if value is None:
        raise CallFailed(f"returned an 'acc' that is not a bool or a finite number: {shorten(repr(acc))}")
    return value >= CORRECT_SCORE


def score_of(result: object) -> Score:
    """The reward, the verdict and the metrics of what the function returned (pure)."""
    if isinstance(result, dict):
        if "score" not in result:
            keys = ", ".join(map(str, result)) or "none"
            raise CallFailed(f"returned a dict without 'score' (keys: {keys})")
        score = _finite(result["score"])
        if score is None:
            raise CallFailed(f"returned a 'score' that is not a finite number: {shorten(repr(result['score']))}")
        correct = _judged(result["acc"]) if "acc" in result else score >= CORRECT_SCORE
        numbers = ((str(k), _finite(v)) for k, v in result.items() if k != "score")
        return Score(score, correct, {k: v for k, v in numbers if v is not None})
    score = _finite(result)
    if score is None:
        raise CallFailed(f"returned {type(result).__name__} {shorten(repr(result))},"
                         " not a finite number or a dict with a 'score'")
    return Score(score, score >= CORRECT_SCORE)


def limit_memory(memory_mb: int) -> None:
    """Cap what this process may allocate at `memory_mb` (reward.memory_mb; 0: no cap), so a
    function that allocates without bound raises MemoryError here instead of taking the node.
    RLIMIT_DATA, not RLIMIT_AS: mapped libraries (a CUDA build of torch maps gigabytes it never
    touches) do not count. Only the soft limit: the sandbox's programs set their own below it."""
    if memory_mb > 0:
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        soft = memory_mb << 20
        resource.setrlimit(resource.RLIMIT_DATA, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def call(fn: RewardFunction, task: CustomTask, timeout_s: float) -> Score:
    """What one call returned; raises CallFailed saying why it gave no reward."""
    try:
        result = _with_deadline(fn, timeout_s, data_source=task.data_source, solution_str=task.response,
                                ground_truth=task.ground_truth, extra_info=task.extra_info)
    except _Timeout:
        raise CallFailed(f"timed out after {timeout_s:g} s") from None
    except MemoryError:
        raise CallFailed("ran out of memory (MemoryError: it allocated past reward.memory_mb)") from None
    except (Exception, SystemExit) as e:
        raise CallFailed(f"raised {type(e).__name__}: {shorten(str(e))}") from None
    return score_of(result)


def scored(function: str, score: Score) -> Verdict:
    """The verdict of a call of `function` that returned `score`."""
    return Verdict(score.reward, int(score.correct), 1, f"score {score.reward:g} from {function}", score.metrics,
                   correct=score.correct)


def failed(function: str, why: str) -> Verdict:
    """The verdict of a call of `function` that gave no reward: FAILED_SCORE, not correct, saying why."""
    return Verdict(FAILED_SCORE, 0, 1, f"custom reward function {function} {why}")


def check_custom(task: CustomTask, fn: RewardFunction, config: RewardConfig) -> Verdict:
    """Score one response with config.function (`fn`), in this process."""
    try:
        return scored(str(config.function), call(fn, task, config.timeout_s))
    except CallFailed as e:
        return failed(str(config.function), str(e))
