"""Advantage normalisation (group / GRPO, global token-weighted, none) against hand values."""

from __future__ import annotations

import pytest

from areal_hpc.trainer.advantages import compute_advantages


def test_group_normalisation_per_prompt():
    adv = compute_advantages([5, -5, 5, 1, 1], [0, 0, 0, 1, 1], [3, 3, 3, 3, 3], "group")
    # prompt 0: mean 5/3, population std sqrt(200/9); prompt 1: all equal -> 0
    std = (200 / 9) ** 0.5
    assert adv[:3] == pytest.approx([(5 - 5 / 3) / std, (-5 - 5 / 3) / std, (5 - 5 / 3) / std], rel=1e-5)
    assert adv[3:] == [0.0, 0.0]


def test_grpo_normalisation_uses_the_unbiased_std():
    adv = compute_advantages([5, -5, 5, 1, 1], [0, 0, 0, 1, 1], [3, 1, 7, 3, 3], "grpo")
    # prompt 0: mean 5/3, squares 200/3 over n - 1 = 2: std sqrt(100/3); lengths do not matter
    std = (100 / 3) ** 0.5
    assert adv[:3] == pytest.approx([(5 - 5 / 3) / std, (-5 - 5 / 3) / std, (5 - 5 / 3) / std], rel=1e-5)
    assert adv[3:] == [0.0, 0.0]


def test_grpo_with_one_sample_per_prompt_is_zero():
    assert compute_advantages([5, -5], [0, 1], [2, 2], "grpo") == [0.0, 0.0]


def test_group_differs_from_grpo_by_the_bessel_factor():
    rewards, prompts, lengths = [5, -5, -5, -5], [0, 0, 0, 0], [1, 2, 3, 4]
    group = compute_advantages(rewards, prompts, lengths, "group")
    grpo = compute_advantages(rewards, prompts, lengths, "grpo")
    assert [a / b for a, b in zip(group, grpo, strict=True)] == pytest.approx([(4 / 3) ** 0.5] * 4, rel=1e-5)


def test_global_normalisation_weighs_by_output_tokens():
    # one 3-token trajectory at +5 and one 1-token trajectory at -5: token mean 2.5, std sqrt(18.75)
    adv = compute_advantages([5, -5], [0, 1], [3, 1], "global")
    std = 18.75 ** 0.5
    assert adv == pytest.approx([2.5 / std, -7.5 / std], rel=1e-5)


def test_none_keeps_rewards():
    assert compute_advantages([5, -5], [0, 0], [1, 1], "none") == [5, -5]


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="adv_norm"):
        compute_advantages([1], [0], [1], "batch")
