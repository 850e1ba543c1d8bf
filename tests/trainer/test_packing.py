"""Algorithm 1 and the balanced split: properties over random and reasoning-like length mixes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_hpc.trainer.errors import BatchError
from areal_hpc.trainer.packing import (
    allocate_micro_batches,
    imbalance,
    micro_batch_lower_bound,
    split_balanced,
)

BUDGET = 4096
lengths_st = st.lists(st.integers(1, BUDGET), min_size=1, max_size=200)


@settings(max_examples=200, deadline=None)
@given(lengths=lengths_st, k_min=st.integers(1, 8))
def test_every_sequence_once_and_no_micro_batch_over_budget(lengths, k_min):
    batches = allocate_micro_batches(lengths, BUDGET, k_min)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= BUDGET for b in batches)
    assert len(batches) >= min(k_min, len(lengths))


def reasoning_lengths(rng: random.Random, n: int, max_len: int) -> list[int]:
    """Long-tailed like reasoning traces: log-normal outputs capped at the generation limit."""
    return [min(max_len, 64 + int(rng.lognormvariate(6.0, 1.0))) for _ in range(n)]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(64, 512))
def test_micro_batch_count_near_lower_bound_on_reasoning_mixes(seed, n):
    lengths = reasoning_lengths(random.Random(seed), n, max_len=BUDGET // 2)
    batches = allocate_micro_batches(lengths, BUDGET)
    bound = micro_batch_lower_bound(lengths, BUDGET)
    assert len(batches) <= max(bound + 1, 1.05 * bound)


def test_k_min_opens_that_many_micro_batches():
    batches = allocate_micro_batches([10] * 8, BUDGET, k_min=4)
    assert len(batches) == 4 and all(len(b) == 2 for b in batches)


def test_sequence_over_budget_is_an_error_naming_it():
    with pytest.raises(BatchError, match=r"sequence 1 has 5000 tokens, more than the micro-batch budget of 4096"):
        allocate_micro_batches([10, 5000, 20], BUDGET)


def test_algorithm_1_joins_the_fitting_batch_with_fewest_sequences():
    # Longest first: 6 opens A; 5 opens B (no room in A); 3 joins A (both fit, equal counts, the
    # first wins); 2 joins B (the only one with room); 1 joins A (both fit, equal counts).
    assert allocate_micro_batches([3, 6, 1, 5, 2], 10) == [[1, 0, 2], [3, 4]]
    # k_min = 2 opens A and B; then each 1 goes to the batch with fewer sequences (not the fullest).
    assert allocate_micro_batches([5, 4, 1, 1, 1], 10, k_min=2) == [[0, 2, 4], [1, 3]]


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 30_000), min_size=0, max_size=300), parts=st.integers(1, 16))
def test_balanced_split_partitions_with_equal_counts(lengths, parts):
    groups = split_balanced(lengths, parts)
    assert len(groups) == parts
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    counts = [len(g) for g in groups]
    assert max(counts) - min(counts) <= 1


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), parts=st.sampled_from([2, 4, 8, 32]))
def test_balanced_split_tokens_within_two_percent(seed, parts):
    lengths = reasoning_lengths(random.Random(seed), 64 * parts, max_len=27_648)
    assert imbalance(lengths, split_balanced(lengths, parts)) <= 1.02


def test_balanced_split_is_deterministic():
    lengths = reasoning_lengths(random.Random(3), 300, 8000)
    assert split_balanced(lengths, 7) == split_balanced(list(lengths), 7)
