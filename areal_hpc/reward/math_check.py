"""Math reward: the extracted final answer against the reference, compared by `math-verify`.

math-verify parses both sides into sympy objects (LaTeX, fractions, decimals, percentages,
intervals, sets, simple expressions) and tests equivalence. Its own timeouts use SIGALRM, which
only works on a process's main thread; the pool's workers call this on their main thread, and the
pool also kills a worker that overruns, so a check that ignores the alarm cannot stall scoring.
"""

from __future__ import annotations

import math
import re
import threading
import time
from functools import lru_cache

from math_verify import parse, verify

from areal_hpc.config.schema import RewardConfig
from areal_hpc.reward.compare import shorten
from areal_hpc.reward.math_answer import extract_answer
from areal_hpc.reward.task import MathTask, Verdict


class _Deadline:
    """Whole seconds left for the next math-verify call (it takes integer timeouts)."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.alarms = threading.current_thread() is threading.main_thread()

    def next_timeout(self) -> int | None:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError
        return max(1, math.ceil(left)) if self.alarms else None

    def expired(self) -> bool:
        """math-verify reports its own timeouts as a failed parse or a False comparison."""
        return time.monotonic() >= self.end


# A `$` that opens or closes math; `\$` is a dollar sign (currency), not a delimiter.
_MATH_DOLLAR = re.compile(r"(?<!\\)\$")


def _as_latex(answer: str) -> str:
    """math-verify finds an answer reliably inside a box or $...$; references are usually bare."""
    if "\\boxed" in answer or _MATH_DOLLAR.search(answer):
        return answer
    return f"\\boxed{{{answer}}}"


def _fallback_words(fallbacks: list[str]) -> str:
    return "".join(f", no {name.replace('_', ' ')}" for name in fallbacks)


@lru_cache(maxsize=4096)
def _parse_reference(reference: str, timeout: int | None) -> tuple:
    # Each prompt is scored group_size times against the same reference.
    return tuple(parse(_as_latex(reference), parsing_timeout=timeout))


def reference_problem(reference: str, timeout_s: float) -> str | None:
    """Why a reference answer is unusable, or None. math-verify returns the bare text beside any
    expression it parsed; a reference with no expression at all (empty, broken LaTeX such as
    `\\frac{1`) matches only a verbatim copy of itself, so it would score nearly every response wrong."""
    deadline = _Deadline(timeout_s)
    try:
        if any(not isinstance(x, str) for x in _parse_reference(reference, deadline.next_timeout())):
            return None
        why = "parsing timed out" if deadline.expired() else "math-verify finds no mathematical expression in it"
    except TimeoutError:
        why = "parsing timed out"
    return f"reference answer {shorten(reference)!r}: {why}, so responses to it would score wrong"


def check_math(task: MathTask, config: RewardConfig) -> Verdict:
    """Score one response: +correct if its final answer equals the reference, else wrong."""

    def fail(reason: str) -> Verdict:
        return Verdict(config.wrong, 0, 1, reason)

    extracted = extract_answer(task.response, config.math_fallbacks)
    if extracted.how == "unclosed box":
        return fail("no answer: the last \\boxed{ never closes (truncated response?)")
    if not extracted.answer:
        return fail(f"no answer found (no \\boxed{{...}}{_fallback_words(config.math_fallbacks)})")
    deadline = _Deadline(config.timeout_s)
    try:
        gold = list(_parse_reference(task.reference, deadline.next_timeout()))
        if not gold:
            return fail(f"reference {shorten(task.reference)!r} could not be parsed")
        pred = parse(_as_latex(extracted.answer), parsing_timeout=deadline.next_timeout())
        if not pred and not deadline.expired():
            return fail(f"answer {shorten(extracted.answer)!r} ({extracted.how}) could not be parsed")
        ok = bool(pred) and verify(gold, pred, timeout_seconds=deadline.next_timeout())
        if not ok and deadline.expired():
            raise TimeoutError
    except TimeoutError:
        return fail(f"verification timed out after {config.timeout_s:g} s")
    if ok:
        return Verdict(config.correct, 1, 1, f"correct ({extracted.how}: {shorten(extracted.answer)})", correct=True)
    return fail(f"wrong answer ({extracted.how}): got {shorten(extracted.answer)!r}, "
                f"expected {shorten(task.reference)!r}")
