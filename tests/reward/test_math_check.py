"""Math reward: answer forms math-verify must accept or reject, malformed answers, the timeout."""

from __future__ import annotations

import time

import pytest

from areal_hpc.config.schema import RewardConfig
from areal_hpc.reward.math_check import check_math, reference_problem
from areal_hpc.reward.task import MathTask

CONFIG = RewardConfig()

# (response, reference, correct?)
CASES = [
    # integers, signs, thousands separators, powers
    ("\\boxed{42}", "42", True),
    ("\\boxed{41}", "42", False),
    ("\\boxed{-7}", "-7", True),
    ("\\boxed{-5}", "5", False),
    ("\\boxed{1,000}", "1000", True),
    ("\\boxed{10^{3}}", "1000", True),
    ("\\boxed{2^{10}}", "1024", True),
    # fractions and decimals
    ("The answer is \\boxed{\\frac{1}{2}}", "0.5", True),
    ("\\boxed{0.5}", "\\frac{1}{2}", True),
    ("\\boxed{\\dfrac{3}{4}}", "0.75", True),
    ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", False),
    ("\\boxed{0.33}", "\\frac{1}{3}", False),
    ("\\boxed{3.0}", "3", True),
    ("\\boxed{\\frac{1}{2}}", "$\\frac12$", True),
    # percentages
    ("\\boxed{50\\%}", "0.5", True),
    ("\\boxed{25\\%}", "25\\%", True),
    ("\\boxed{30\\%}", "0.25", False),
    # intervals
    ("\\boxed{(1, 2]}", "\\left(1,2\\right]", True),
    ("\\boxed{[0, \\infty)}", "[0,\\infty)", True),
    ("\\boxed{(1,2)}", "[1,2]", False),
    ("\\boxed{[0,1)}", "[0,1]", False),
    # sets (escaped braces inside the box)
    ("\\boxed{\\{1, 2\\}}", "\\{2,1\\}", True),
    ("\\boxed{\\{1,2,3\\}}", "\\{1,2\\}", False),
    # expressions, radicals, constants
    ("\\boxed{x^2+2x+1}", "(x+1)^2", True),
    ("\\boxed{x^2+1}", "(x+1)^2", False),
    ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}", True),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", True),
    ("\\boxed{2\\sqrt{2}}", "2\\sqrt{3}", False),
    ("\\boxed{2\\pi}", "2\\pi", True),
    ("\\boxed{\\pi}", "3.14", False),
    ("\\boxed{x = 3}", "3", True),
    ("\\boxed{\\text{(B)}}", "B", True),
    ("\\boxed{\\begin{pmatrix}1\\\\2\\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", True),
    ("\\boxed{abc}", "42", False),
    # which box counts
    ("First \\boxed{3}, corrected: \\boxed{5}", "5", True),
    ("\\boxed{3} then \\boxed{4}", "3", False),
    ("\\fbox{12}", "12", True),
    ("\\boxed 7", "7", True),
    ("\\boxed{\\boxed{7}}", "7", True),
    ("\\boxed{{3}}", "3", True),
    ("}{ stray braces \\boxed{5}}", "5", True),
    # currency: an escaped dollar sign is text, not a math delimiter
    ("\\boxed{\\$18.90}", "18.90", True),
    ("\\boxed{\\$5}", "5", True),
    ("\\boxed{18.90}", "\\$18.90", True),
    ("\\boxed{\\$18.90}", "\\$18.90", True),
    ("\\boxed{\\$18.91}", "18.90", False),
    ("The total is $\\$18.90$ and \\boxed{\\$ 18.90}", "18.9", True),
    # the answer-phrase fallback (on by default) takes the answer, not the sentence
    ("The answer is 12.", "12", True),
    ("Answer: $\\frac{2}{3}$", "2/3", True),
    ("The answer is 42 because it is even.", "42", True),
    ("The answer is 5 cm, as shown.", "5", True),
    ("The answer is 41 because 42 is even.", "42", False),
    # the last-number fallback is off by default
    ("so we get 3 + 4 = 7", "7", False),
    # malformed: no answer at all, empty or unbalanced boxes
    ("I do not know.", "42", False),
    ("\\boxed{}", "42", False),
    ("\\boxed{12", "12", False),
    ("\\boxed{\\frac{1}{2}", "\\frac{1}{2}", False),
    ("I think 5 but \\boxed{6", "5", False),
]


@pytest.mark.parametrize("response, reference, correct", CASES)
def test_math_verdict(response: str, reference: str, correct: bool) -> None:
    verdict = check_math(MathTask(response, reference), CONFIG)
    assert verdict.reward == (CONFIG.correct if correct else CONFIG.wrong), verdict.reason
    assert (verdict.passed, verdict.total) == (int(correct), 1)
    assert verdict.reason


@pytest.mark.parametrize("fallbacks, response, correct", [
    ([], "The answer is 12.", False),
    ([], "\\boxed{12}", True),
    (["answer_phrase"], "so we get 3 + 4 = 12", False),
    (["last_number"], "so we get 3 + 4 = 12", True),
    (["last_number"], "The answer is 12 apples, not 13", False),
    (["answer_phrase", "last_number"], "The answer is 12 apples, not 13", True),
    (["answer_phrase", "last_number"], "so 3 + 9 = 12", True),
])
def test_configured_fallbacks(fallbacks: list[str], response: str, correct: bool) -> None:
    config = RewardConfig(math_fallbacks=fallbacks)
    verdict = check_math(MathTask(response, "12"), config)
    assert verdict.reward == (config.correct if correct else config.wrong), verdict.reason


def test_without_fallbacks_the_reason_names_what_was_looked_for() -> None:
    assert check_math(MathTask("so 12", "12"), RewardConfig(math_fallbacks=[])).reason == (
        "no answer found (no \\boxed{...})")
    assert check_math(MathTask("so 12", "12"), CONFIG).reason == "no answer found (no \\boxed{...}, no answer phrase)"


@pytest.mark.parametrize("reference", ["", "???", "\\frac{1", "\\$"])
def test_an_unusable_reference_is_named(reference: str) -> None:
    problem = reference_problem(reference, 5.0)
    assert problem is not None and repr(reference) in problem


@pytest.mark.parametrize("reference", ["42", "\\$18.90", "\\frac{1}{2}", "(1, 2]", "B", "x^2+1"])
def test_usable_references_pass(reference: str) -> None:
    assert reference_problem(reference, 5.0) is None


def test_at_least_forty_cases_both_ways() -> None:
    assert len(CASES) >= 40
    assert {c for _, _, c in CASES} == {True, False}


def test_malformed_answers_say_why() -> None:
    assert "never closes" in check_math(MathTask("\\boxed{12", "12"), CONFIG).reason
    assert "no answer" in check_math(MathTask("I do not know.", "42"), CONFIG).reason


def test_configured_rewards() -> None:
    config = RewardConfig(correct=1.0, wrong=0.0)
    assert check_math(MathTask("\\boxed{2}", "2"), config).reward == 1.0
    assert check_math(MathTask("\\boxed{3}", "2"), config).reward == 0.0


def test_a_check_that_explodes_times_out() -> None:
    config = RewardConfig(timeout_s=1.0)
    start = time.monotonic()
    verdict = check_math(MathTask("\\boxed{10^{10^{10}}}", "1"), config)
    assert time.monotonic() - start < 4.0
    assert verdict.reward == config.wrong
    assert "timed out" in verdict.reason
