"""Evaluation metrics over n samples per prompt: avg@n, pass@k, maj@n and the standard error.

Pure functions (no I/O), shared by `areal-hpc eval` and anything else that scores a checkpoint:
- avg@n: the mean accuracy over every sample of every prompt (each prompt weighs the same, since
  all have n samples);
- pass@k, k = 1, 2, 4, ... and n: the chance that at least one of k samples drawn without
  replacement from a prompt's n is correct, estimated without bias as 1 - C(n-c, k) / C(n, k)
  (Chen et al. 2021, HumanEval) and averaged over prompts;
- maj@n: a prompt counts as solved when its most frequent final answer is correct. Answers are
  compared as written, whitespace aside ("1/2" and "0.5" vote apart). Ties go to the answer whose
  first sample comes first, so the vote is deterministic. Samples without an answer do not vote;
  a prompt none of whose samples has one is not solved. Only prompts whose answers are comparable
  vote (math rewards; a program or a custom function's input is no comparable answer): maj@n is
  over those prompts, and None where a set has none;
- stderr: the standard error of avg@n over prompts (sample std of the per-prompt accuracies,
  ddof 1, over sqrt(prompts)); None for a single prompt.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

# Reward kinds whose extracted answers may be compared across samples (majority vote).
VOTING_KINDS = frozenset({"math"})


@dataclass(frozen=True)
class Sample:
    """One scored sample, as far as the metrics need it."""

    # Which prompt of its data set (0-based row index in the file).
    prompt: int
    data_source: str | None
    # The reward kind that scored it ("math", "code", "custom").
    kind: str
    correct: bool
    # The extracted final answer; None when the response has none or the kind has none.
    answer: str | None
    # Tokens in the response.
    tokens: int


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with c correct of n samples: 1 - C(n-c, k) / C(n, k),
    computed as a product so large n does not overflow."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def ks_for(n: int) -> list[int]:
    """The k of pass@k reported for n samples: powers of two below n, and n."""
    ks = []
    k = 1
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n]


def majority(answers: Sequence[str | None]) -> int | None:
    """Index of the sample whose answer wins the vote (its first sample; ties to the answer seen
    first); None when no sample has an answer."""
    keys = [None if a is None else " ".join(a.split()) for a in answers]
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(i for i, k in enumerate(keys) if k is not None and counts[k] == best)


def _by_prompt(samples: Sequence[Sample], n: int) -> dict[int, list[Sample]]:
    groups: dict[int, list[Sample]] = {}
    for s in samples:
        groups.setdefault(s.prompt, []).append(s)
    for prompt, group in groups.items():
        if len(group) != n:
            raise ValueError(f"prompt {prompt} has {len(group)} samples, expected {n}")
    return groups


def stderr(values: Sequence[float]) -> float | None:
    """Standard error of the mean of `values` (ddof 1); None for fewer than two."""
    m = len(values)
    if m < 2:
        return None
    mean = sum(values) / m
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (m - 1) / m)


def summarize(samples: Sequence[Sample], n: int) -> dict:
    """rows, samples, avg@n, pass@k (keys "1", "2", ...), maj@n, stderr and mean_response_tokens
    of one set of samples (n per prompt)."""
    groups = _by_prompt(samples, n)
    if not groups:
        raise ValueError("no samples to summarize")
    accuracy = [sum(s.correct for s in g) / n for g in groups.values()]
    correct = [sum(s.correct for s in g) for g in groups.values()]
    votes = []
    for g in groups.values():
        if g[0].kind in VOTING_KINDS:
            winner = majority([s.answer for s in g])
            votes.append(winner is not None and g[winner].correct)
    return {
        "rows": len(groups),
        "samples": len(samples),
        "avg@n": sum(accuracy) / len(accuracy),
        "pass@k": {str(k): sum(pass_at_k(n, c, k) for c in correct) / len(correct) for k in ks_for(n)},
        "maj@n": sum(votes) / len(votes) if votes else None,
        "stderr": stderr(accuracy),
        "mean_response_tokens": sum(s.tokens for s in samples) / len(samples),
    }


def summarize_dataset(samples: Sequence[Sample], n: int) -> dict:
    """`summarize` of the whole set, with `by_source`: the same per data_source present (samples
    without a source count only in the whole)."""
    sources: dict[str, list[Sample]] = {}
    for s in samples:
        if s.data_source is not None:
            sources.setdefault(s.data_source, []).append(s)
    return {**summarize(samples, n), "by_source": {src: summarize(group, n) for src, group in sorted(sources.items())}}
