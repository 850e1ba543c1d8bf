"""Math reward: the extracted final answer against the reference, compared by `math-verify`.

math-verify parses both sides into sympy objects (LaTeX, fractions, decimals, percentages,
intervals, sets, simple expressions) and tests equivalence. Its own timeouts use SIGALRM, which
only works on a process's main thread; the pool's workers call this on their main thread, and the
pool also kills a worker that overruns, so a check that ignores the alarm cannot stall scoring.
"""

from __future__ import annotations

import math
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


def _as_latex(answer: str) -> str:
    """math-verify finds an answer reliably inside a box; references are usually bare."""
    return answer if "\\boxed" in answer or "$" in answer else f"\\boxed{{{answer}}}"


@lru_cache(maxsize=4096)
def _parse_reference(reference: str, timeout: int | None) -> tuple:
    # Each prompt is scored group_size times against the same reference.
    return tuple(parse(_as_latex(reference), parsing_timeout=timeout))


def check_math(task: MathTask, config: RewardConfig) -> Verdict:
    """Score one response: +correct if its final answer equals the reference, else wrong."""

    def fail(reason: str) -> Verdict:
        return Verdict(config.wrong, 0, 1, reason)

    extracted = extract_answer(task.response)
    if extracted.how == "unclosed box":
        return fail("no answer: the last \\boxed{ never closes (truncated response?)")
    if not extracted.answer:
        return fail("no answer found (no \\boxed{...}, answer phrase or number)")
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
        return Verdict(config.correct, 1, 1, f"correct ({extracted.how}: {shorten(extracted.answer)})")
    return fail(f"wrong answer ({extracted.how}): got {shorten(extracted.answer)!r}, "
                f"expected {shorten(task.reference)!r}")
