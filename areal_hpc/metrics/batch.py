"""What one trained batch says about the run: reward, accuracy, staleness, lengths, tokens, and
per data source (mixed data) and per custom reward metric when the batch has them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from areal_hpc.wire.messages import Trajectory


def staleness_histogram(trajectories: Sequence[Trajectory], version: int) -> dict[int, int]:
    """Trajectories per staleness: policy version trained minus the trajectory's oldest token version."""
    return dict(sorted(Counter(version - t.oldest_version for t in trajectories).items()))


def batch_stats(trajectories: Sequence[Trajectory], version: int) -> dict[str, float]:
    """Accuracy counts the trajectories whose reward check judged them right (Trajectory.correct),
    whatever the scale of their rewards: a custom function's 0/1 and the built-in +5/-5 alike."""
    n = len(trajectories)
    if n == 0:
        raise ValueError("an empty batch has no statistics")
    hist = staleness_histogram(trajectories, version)
    stats = {
        "reward_mean": sum(t.reward for t in trajectories) / n,
        "accuracy": accuracy(trajectories),
        "trained_tokens": float(sum(t.num_tokens for t in trajectories)),
        "response_len_mean": sum(len(t.output_ids) for t in trajectories) / n,
        "response_len_max": float(max(len(t.output_ids) for t in trajectories)),
        "truncated_fraction": sum(t.finish_reason == "length" for t in trajectories) / n,
        "staleness_max": float(max(hist)),
        "staleness_mean": sum(s * c for s, c in hist.items()) / n,
    }
    stats.update({f"staleness_hist/{s}": float(c) for s, c in hist.items()})
    stats.update(cost_stats(trajectories))
    stats.update(source_stats(trajectories))
    stats.update(reward_metric_means(trajectories))
    return stats


def cost_stats(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """What the simulator's fit (areal_hpc/sim/run_fit.py) reads of a batch: the sum of squared
    sequence lengths (attention FLOPs), the mean reward latency, and the response lengths' log
    moments, overall and within prompt groups (the share of length variance a prompt sets)."""
    n = len(trajectories)
    logs = np.log(np.array([max(len(t.output_ids), 1) for t in trajectories], dtype=np.float64))
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(trajectories):
        groups.setdefault(t.prompt_id, []).append(i)
    within = sum(float(((logs[i] - logs[i].mean()) ** 2).sum()) for i in map(np.array, groups.values()))
    return {
        "trained_tokens_sq": float(sum(t.num_tokens ** 2 for t in trajectories)),
        "reward_s_mean": sum(t.reward_s for t in trajectories) / n,
        "response_len_log_mean": float(logs.mean()),
        "response_len_log_std": float(logs.std()),
        "response_len_log_within_std": (within / max(n - len(groups), 1)) ** 0.5,
    }


def source_stats(trajectories: Sequence[Trajectory], prefix: str = "source/") -> dict[str, float]:
    """`<prefix><data_source>/reward_mean` and `.../accuracy` of each data source present (a mixed
    run's overall mean hides which data set improves); trajectories without a source count only
    in the overall keys."""
    by_source: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        if t.data_source is not None:
            by_source.setdefault(t.data_source, []).append(t)
    stats = {}
    for source, ts in sorted(by_source.items()):
        stats[f"{prefix}{source}/reward_mean"] = sum(t.reward for t in ts) / len(ts)
        stats[f"{prefix}{source}/accuracy"] = accuracy(ts)
    return stats


def reward_metric_means(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """`reward/<key>`: the mean of each metric a custom reward function returned beside its score,
    over the trajectories that have it."""
    values: dict[str, list[float]] = {}
    for t in trajectories:
        for key, value in t.reward_metrics.items():
            values.setdefault(key, []).append(value)
    return {f"reward/{key}": sum(v) / len(v) for key, v in sorted(values.items())}


def accuracy(trajectories: Sequence[Trajectory]) -> float:
    return sum(t.correct for t in trajectories) / max(len(trajectories), 1)
