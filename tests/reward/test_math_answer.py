"""Final-answer extraction: boxes, nesting, escaped and unbalanced braces, and the fallbacks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from areal_hpc.config.validate import LIST_CHOICES
from areal_hpc.reward.math_answer import FALLBACKS, extract_answer, last_boxed


@pytest.mark.parametrize(
    "text, answer, how",
    [
        ("so \\boxed{42}.", "42", "boxed"),
        ("\\boxed{1} then \\boxed{2}", "2", "boxed"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}", "boxed"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}", "boxed"),
        ("\\boxed{\\boxed{7}}", "7", "boxed"),
        ("\\fbox{12}", "12", "boxed"),
        ("\\boxed {5}", "5", "boxed"),
        ("\\boxed 7 is it", "7", "boxed"),
        ("}{ \\boxed{5}}", "5", "boxed"),
        ("\\boxed{  x = 3 }", "x = 3", "boxed"),
        ("\\boxed{}", "", "boxed"),
        ("\\boxed{12", None, "unclosed box"),
        ("\\boxed{3} and finally \\boxed{\\frac{1}{2}", None, "unclosed box"),
        ("\\boxed", None, "unclosed box"),
        ("The final answer is $\\frac{2}{3}$.", "\\frac{2}{3}", "answer phrase"),
        ("**Answer:** 17", "17", "answer phrase"),
        ("The answer is 42 because it is even.", "42", "answer phrase"),
        ("The answer is 5 cm", "5", "answer phrase"),
        ("The answer is 3/4. Done.", "3/4", "answer phrase"),
        ("Answer: x = 5", "x = 5", "answer phrase"),
        ("The answer is 2 pi.", "2 pi", "answer phrase"),
        ("The answer is 12, so we stop", "12", "answer phrase"),
        ("The answer is \\frac{1}{2} or 0.5", "\\frac{1}{2}", "answer phrase"),
        ("The answer is \\$18.90.", "\\$18.90", "answer phrase"),
        ("3 + 4 = 7", None, "none"),
        ("no answer here", None, "none"),
        ("", None, "none"),
    ],
)
def test_extract_answer(text: str, answer: str | None, how: str) -> None:
    got = extract_answer(text)
    assert (got.answer, got.how) == (answer, how)


@pytest.mark.parametrize(
    "text, answer",
    [
        ("3 + 4 = 7", "7"),
        ("we get -1,250.5 apples", "-1,250.5"),
        ("ratio 3/4", "3/4"),
        ("no answer here", None),
    ],
)
def test_last_number_fallback_when_enabled(text: str, answer: str | None) -> None:
    got = extract_answer(text, fallbacks=("last_number",))
    assert got.answer == answer and got.how == ("last number" if answer else "none")


def test_fallbacks_in_order_and_off() -> None:
    text = "The answer is 12 apples, then 13"
    assert extract_answer(text, ("answer_phrase", "last_number")).answer == "12"
    assert extract_answer(text, ("last_number",)).answer == "13"
    assert extract_answer(text, ("last_number", "answer_phrase")).answer == "13"
    assert extract_answer("Answer: $\\$18.90$ total", ()).how == "none"
    assert extract_answer("Answer: $\\$18.90$ total").answer == "\\$18.90"
    assert extract_answer(text, ()).how == "none"


_balanced = st.recursive(
    st.text(alphabet="abc123+-^_ ", max_size=5),
    lambda inner: st.builds(lambda a, b: a + "{" + b + "}", inner, inner),
    max_leaves=8,
)


@given(prefix=st.text(alphabet="xyz {}", max_size=10), content=_balanced)
def test_last_box_content_roundtrips(prefix: str, content: str) -> None:
    assert last_boxed(f"{prefix} \\boxed{{{content}}} done").answer == content.strip()


@given(content=_balanced)
def test_box_without_its_closing_brace_is_no_answer(content: str) -> None:
    assert last_boxed(f"\\boxed{{{content}").how == "unclosed box"


def test_every_configurable_fallback_exists() -> None:
    assert tuple(FALLBACKS) == LIST_CHOICES["reward.math_fallbacks"]
