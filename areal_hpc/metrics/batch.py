"""What one trained batch says about the run: reward, accuracy, staleness, lengths, tokens."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from areal_hpc.wire.messages import Trajectory


def staleness_histogram(trajectories: Sequence[Trajectory], version: int) -> dict[int, int]:
    """Trajectories per staleness: policy version trained minus the trajectory's oldest token version."""
    return dict(sorted(Counter(version - t.oldest_version for t in trajectories).items()))


def batch_stats(trajectories: Sequence[Trajectory], version: int, correct_reward: float) -> dict[str, float]:
    """A trajectory counts as correct when its reward reaches the reward of a correct answer."""
    n = len(trajectories)
    if n == 0:
        raise ValueError("an empty batch has no statistics")
    hist = staleness_histogram(trajectories, version)
    stats = {
        "reward_mean": sum(t.reward for t in trajectories) / n,
        "accuracy": sum(t.reward >= correct_reward for t in trajectories) / n,
        "trained_tokens": float(sum(t.num_tokens for t in trajectories)),
        "response_len_mean": sum(len(t.output_ids) for t in trajectories) / n,
        "response_len_max": float(max(len(t.output_ids) for t in trajectories)),
        "truncated_fraction": sum(t.finish_reason == "length" for t in trajectories) / n,
        "staleness_max": float(max(hist)),
        "staleness_mean": sum(s * c for s, c in hist.items()) / n,
    }
    stats.update({f"staleness_hist/{s}": float(c) for s, c in hist.items()})
    return stats


def accuracy(trajectories: Sequence[Trajectory], correct_reward: float) -> float:
    return sum(t.reward >= correct_reward for t in trajectories) / max(len(trajectories), 1)
