"""Dynamic micro-batch allocation (the paper's Algorithm 1) and the token-balanced batch split.

Pure functions over sequence lengths; they return indices into the input, so callers keep their
own records. Padding-free: a micro-batch is its sequences back to back, so its cost is the sum of
its lengths and the token budget bounds that sum.
"""

from __future__ import annotations

import bisect
import math

from areal_hpc.trainer.errors import BatchError


def _longest_first(lengths: list[int]) -> list[int]:
    return sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))


def allocate_micro_batches(lengths: list[int], budget: int, k_min: int = 1) -> list[list[int]]:
    """Algorithm 1: pack sequences into micro-batches of at most `budget` tokens.

    Longest first; a sequence opens a new micro-batch while there are fewer than `k_min` or none
    has room, else joins the micro-batch with room that holds the fewest sequences. Raises
    BatchError for a sequence longer than the budget.
    """
    too_long = [(i, n) for i, n in enumerate(lengths) if n > budget]
    if too_long:
        i, n = too_long[0]
        raise BatchError(
            f"sequence {i} has {n} tokens, more than the micro-batch budget of {budget}"
            f" (trainer.micro_batch_tokens); {len(too_long)} sequence(s) are over it"
        )
    batches: list[list[int]] = []
    used: list[int] = []
    for i in _longest_first(lengths):
        fitting = [b for b in range(len(batches)) if used[b] + lengths[i] <= budget]
        if len(batches) < k_min or not fitting:
            batches.append([i])
            used.append(lengths[i])
        else:
            b = min(fitting, key=lambda b: (len(batches[b]), b))
            batches[b].append(i)
            used[b] += lengths[i]
    return batches


def micro_batch_lower_bound(lengths: list[int], budget: int) -> int:
    """No packing can use fewer micro-batches than this."""
    return max(1, math.ceil(sum(lengths) / budget))


def split_balanced(lengths: list[int], parts: int) -> list[list[int]]:
    """Split sequences into `parts` groups of equal count (+-1) and near-equal token sums.

    Longest first, each to the lightest group that may still take one; then swaps between the
    heaviest and the lightest group while a swap narrows their gap. Deterministic.
    """
    if parts < 1:
        raise ValueError(f"parts = {parts}: must be >= 1")
    base, extra = divmod(len(lengths), parts)
    groups: list[list[int]] = [[] for _ in range(parts)]
    sums = [0] * parts
    for i in _longest_first(lengths):
        full = sum(len(g) > base for g in groups) >= extra
        open_ = [p for p in range(parts) if len(groups[p]) < base + (0 if full else 1)]
        p = min(open_, key=lambda p: (sums[p], p))
        groups[p].append(i)
        sums[p] += lengths[i]
    for _ in range(4 * len(lengths)):
        hi = max(range(parts), key=lambda p: (sums[p], -p))
        lo = min(range(parts), key=lambda p: (sums[p], p))
        gap = sums[hi] - sums[lo]
        if gap == 0:
            break
        best = _best_swap(lengths, groups[hi], groups[lo], gap)
        if best is None:
            break
        a, b = best
        groups[hi][groups[hi].index(a)] = b
        groups[lo][groups[lo].index(b)] = a
        moved = lengths[a] - lengths[b]
        sums[hi] -= moved
        sums[lo] += moved
    return [sorted(g) for g in groups]


def _best_swap(lengths: list[int], heavy: list[int], light: list[int], gap: int) -> tuple[int, int] | None:
    """The (heavy item, light item) exchange that most narrows `gap`, if any narrows it."""
    light_sorted = sorted(light, key=lambda i: lengths[i])
    light_lengths = [lengths[i] for i in light_sorted]
    best, best_gap = None, gap
    for a in heavy:
        # Moving d = len(a) - len(b) tokens leaves a gap of |gap - 2d|; the best b has len(a) - gap/2.
        k = bisect.bisect_left(light_lengths, lengths[a] - gap / 2)
        for j in (k - 1, k):
            if 0 <= j < len(light_sorted):
                d = lengths[a] - light_lengths[j]
                if 0 < d and abs(gap - 2 * d) < best_gap:
                    best, best_gap = (a, light_sorted[j]), abs(gap - 2 * d)
    return best


def imbalance(lengths: list[int], groups: list[list[int]]) -> float:
    """Heaviest group's tokens over the mean group's (1.0 is perfect balance)."""
    sums = [sum(lengths[i] for i in g) for g in groups]
    mean = sum(sums) / len(sums)
    return max(sums) / mean if mean else 1.0
