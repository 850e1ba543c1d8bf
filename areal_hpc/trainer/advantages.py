"""Advantages from rewards: no critic, gamma = lambda = 1, one reward at the end of a sample.

Every output token of a trajectory then has the same advantage, so advantages are one number per
trajectory. Normalisation (cfg.ppo.adv_norm):
- "group" (GRPO): subtract the mean of the samples of the same prompt, divide by their std;
- "global": subtract the mean over all output tokens of the batch, divide by their std (each
  trajectory weighs as many times as it has output tokens, as with per-token advantages);
- "none": the raw reward.
"""

from __future__ import annotations

import math
from collections import defaultdict

EPS = 1e-6


def _standardise(values: list[float], weights: list[float]) -> list[float]:
    total = sum(weights)
    if total == 0:
        return [0.0] * len(values)
    mean = sum(v * w for v, w in zip(values, weights, strict=True)) / total
    var = sum(w * (v - mean) ** 2 for v, w in zip(values, weights, strict=True)) / total
    return [(v - mean) / (math.sqrt(var) + EPS) for v in values]


def compute_advantages(rewards: list[float], prompt_ids: list[int], lengths: list[int], mode: str) -> list[float]:
    """One advantage per trajectory; `lengths` are output-token counts (the "global" weights)."""
    if mode == "none":
        return list(rewards)
    if mode == "global":
        return _standardise(rewards, [float(n) for n in lengths])
    if mode == "group":
        groups: dict[int, list[int]] = defaultdict(list)
        for i, p in enumerate(prompt_ids):
            groups[p].append(i)
        out = [0.0] * len(rewards)
        for members in groups.values():
            for i, a in zip(members, _standardise([rewards[i] for i in members], [1.0] * len(members)), strict=True):
                out[i] = a
        return out
    raise ValueError(f"adv_norm = {mode!r}: must be global, group or none")
