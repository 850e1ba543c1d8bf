"""Evaluation metrics against values computed by hand."""

from __future__ import annotations

import math

import pytest

from areal_hpc.evaluation.metrics import (
    Sample,
    ks_for,
    majority,
    pass_at_k,
    stderr,
    summarize,
    summarize_dataset,
)


def samples(prompt: int, correct: list[bool], answers: list[str | None] | None = None, kind: str = "math",
            source: str | None = None, tokens: int = 10) -> list[Sample]:
    answers = answers or [None] * len(correct)
    return [Sample(prompt, source, kind, c, a, tokens) for c, a in zip(correct, answers, strict=True)]


def test_pass_at_k_one_correct_of_four():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 1, 4) == 1.0


def test_pass_at_k_edges_and_a_larger_case():
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 3, 2) == 1.0  # n - c < k: every pair holds a correct one
    # n=32, c=2, k=4: 1 - C(30,4)/C(32,4) = 1 - 27405/35960
    assert pass_at_k(32, 2, 4) == pytest.approx(1 - 27405 / 35960)
    assert pass_at_k(32, 2, 4) == pytest.approx(1 - math.comb(30, 4) / math.comb(32, 4))
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_ks_are_powers_of_two_and_n():
    assert ks_for(1) == [1]
    assert ks_for(4) == [1, 2, 4]
    assert ks_for(6) == [1, 2, 4, 6]
    assert ks_for(32) == [1, 2, 4, 8, 16, 32]


def test_majority_ties_go_to_the_answer_seen_first():
    assert majority(["3", "4", "4", "3"]) == 0  # 2 votes each: "3" came first
    assert majority(["4", "3", "3", "4"]) == 0
    assert majority([None, "5", "7", "7"]) == 2
    assert majority([None, " 1/2", "1/2 ", "7"]) == 1  # whitespace does not split votes
    assert majority([None, None]) is None


def test_summary_by_hand():
    # prompt 0: 1 of 4 correct, majority "4" (wrong, 2 votes) beats "3" (correct, 1 vote)
    # prompt 1: 4 of 4 correct, all "9"
    # prompt 2: 0 of 4 correct, no answers at all
    data = (samples(0, [True, False, False, False], ["3", "4", "4", None])
            + samples(1, [True] * 4, ["9"] * 4)
            + samples(2, [False] * 4))
    m = summarize(data, 4)
    assert m["rows"] == 3 and m["samples"] == 12
    assert m["avg@n"] == pytest.approx((0.25 + 1 + 0) / 3)
    assert m["pass@k"] == pytest.approx({"1": (0.25 + 1 + 0) / 3, "2": (0.5 + 1 + 0) / 3, "4": (1 + 1 + 0) / 3})
    assert m["maj@n"] == pytest.approx(1 / 3)
    mean = 1.25 / 3
    sd = math.sqrt(((0.25 - mean) ** 2 + (1 - mean) ** 2 + mean**2) / 2)
    assert m["stderr"] == pytest.approx(sd / math.sqrt(3))
    assert m["mean_response_tokens"] == 10


def test_majority_tie_decides_the_prompt():
    correct_first = samples(0, [True, False, True, False], ["3", "4", "3", "4"])
    wrong_first = samples(0, [False, True, False, True], ["4", "3", "4", "3"])
    assert summarize(correct_first, 4)["maj@n"] == 1.0
    assert summarize(wrong_first, 4)["maj@n"] == 0.0


def test_code_prompts_do_not_vote():
    code = samples(0, [True, False], kind="code") + samples(1, [True, True], kind="code")
    m = summarize(code, 2)
    assert m["maj@n"] is None
    assert m["avg@n"] == pytest.approx(0.75)
    mixed = code + samples(2, [False, False], ["1", "1"])
    assert summarize(mixed, 2)["maj@n"] == 0.0  # over the math prompt only


def test_per_source_split():
    data = (samples(0, [True, True], ["1", "1"], source="gsm8k", tokens=4)
            + samples(1, [False, False], ["2", "2"], source="aime", tokens=8)
            + samples(2, [True, False], ["5", "6"], source="gsm8k", tokens=6)
            + samples(3, [False, True], ["7", "8"]))  # no source: in the whole only
    m = summarize_dataset(data, 2)
    assert m["rows"] == 4 and m["avg@n"] == pytest.approx(0.5)
    assert set(m["by_source"]) == {"aime", "gsm8k"}
    g = m["by_source"]["gsm8k"]
    assert g["rows"] == 2 and g["avg@n"] == pytest.approx(0.75)
    assert g["pass@k"] == pytest.approx({"1": 0.75, "2": 1.0})
    assert g["maj@n"] == 1.0  # prompt 0 unanimous; prompt 2's tie goes to "5", seen first and correct
    assert g["mean_response_tokens"] == pytest.approx(5)
    a = m["by_source"]["aime"]
    assert a["rows"] == 1 and a["avg@n"] == 0.0 and a["stderr"] is None


def test_stderr_and_unequal_groups():
    assert stderr([1.0]) is None
    assert stderr([0.0, 1.0]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="prompt 0 has 1 samples, expected 2"):
        summarize(samples(0, [True]), 2)
