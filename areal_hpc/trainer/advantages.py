"""Advantages from rewards: no critic, gamma = lambda = 1, one reward at the end of a sample.

Every output token of a trajectory then has the same advantage, so advantages are one number per
trajectory. Normalisation (cfg.ppo.adv_norm; each option's definition is in config/schema.py):
- "global": minus the mean over all output tokens of the batch, over their population std (each
  trajectory weighs as many times as it has output tokens, as with per-token advantages);
- "group": per prompt, minus the mean of its samples, over their population std, samples weighted
  equally;
- "grpo": per prompt, minus the mean of its samples, over their unbiased (n - 1) std, as GRPO
  and AReaL's current code define it; a prompt with one sample gets advantage 0;
- "none": the raw reward.
"""

from __future__ import annotations

import math
from collections import defaultdict

EPS = 1e-6


def _standardise(values: list[float], weights: list[float], unbiased: bool = False) -> list[float]:
    """(v - mean) / (std + EPS) with weighted mean and variance; `unbiased` divides the sum of
    squares by (n - 1) instead of n (equal weights only)."""
    total = sum(weights)
    if total == 0:
        return [0.0] * len(values)
    mean = sum(v * w for v, w in zip(values, weights, strict=True)) / total
    squares = sum(w * (v - mean) ** 2 for v, w in zip(values, weights, strict=True))
    if unbiased:
        var = squares / (total - 1) if total > 1 else 0.0
    else:
        var = squares / total
    return [(v - mean) / (math.sqrt(var) + EPS) for v in values]


def compute_advantages(rewards: list[float], prompt_ids: list[int], lengths: list[int], mode: str) -> list[float]:
    """One advantage per trajectory; `lengths` are output-token counts (the "global" weights)."""
    if mode == "none":
        return list(rewards)
    if mode == "global":
        return _standardise(rewards, [float(n) for n in lengths])
    if mode in ("group", "grpo"):
        groups: dict[int, list[int]] = defaultdict(list)
        for i, p in enumerate(prompt_ids):
            groups[p].append(i)
        out = [0.0] * len(rewards)
        for members in groups.values():
            normalised = _standardise([rewards[i] for i in members], [1.0] * len(members), unbiased=mode == "grpo")
            for i, a in zip(members, normalised, strict=True):
                out[i] = a
        return out
    raise ValueError(f"adv_norm = {mode!r}: must be global, group, grpo or none")
