"""Generation lengths of reasoning traces: log-normal (long right tail), capped at the limit, and
correlated within a prompt's group of samples.

Distilled reasoning models write a few thousand tokens on most problems and run on to the cap on
a sizeable minority (unsolved problems, repetition loops), which is what stalls a synchronous
batch. A log-normal has that shape; the cap turns its tail into a point mass at the limit. Hard
prompts make all their samples long, so part of the log-length variance is shared by a group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from areal_hpc.errors import UserError


@dataclass(frozen=True)
class LengthDistribution:
    """Generated tokens per trajectory: min(cap, median * exp(sigma * z)), at least 1, where
    z = sqrt(prompt_share) * z_prompt + sqrt(1 - prompt_share) * z_sample."""

    # Median of the uncapped distribution, tokens.
    median: float
    # Log-space standard deviation: 0 gives a constant, 1 a tail that reaches ~5x the median at
    # the 95th percentile.
    sigma: float
    # The generation limit (max_new_tokens).
    cap: int
    # Share of the log-length variance common to all samples of one prompt (0: independent).
    prompt_share: float = 0.0

    def __post_init__(self) -> None:
        if self.median <= 0 or self.sigma < 0 or self.cap < 1 or not 0 <= self.prompt_share <= 1:
            raise UserError(f"length distribution needs median > 0, sigma >= 0, cap >= 1 and "
                            f"prompt_share in [0, 1]; got {self}")

    def sample(self, rng: np.random.Generator, groups: int, size: int) -> np.ndarray:
        """Lengths of `groups` prompts x `size` samples each, shape (groups, size)."""
        shared = rng.standard_normal((groups, 1))
        own = rng.standard_normal((groups, size))
        z = math.sqrt(self.prompt_share) * shared + math.sqrt(1.0 - self.prompt_share) * own
        return np.clip(np.rint(self.median * np.exp(self.sigma * z)), 1, self.cap).astype(np.int64)

    def capped_fraction(self) -> float:
        """P(length == cap): the share of traces that hit the limit."""
        if self.sigma == 0:
            return float(self.median >= self.cap)
        z = math.log(self.cap / self.median) / self.sigma
        return 0.5 * math.erfc(z / math.sqrt(2.0))

    def with_cap(self, cap: int) -> LengthDistribution:
        return replace(self, cap=cap)


class LengthStream:
    """One sequence of groups' lengths drawn in fixed blocks, so that systems asking for different
    numbers at a time (a whole batch, or one prompt per free slot) see the same lengths."""

    BLOCK = 256

    def __init__(self, dist: LengthDistribution, group_size: int, rng: np.random.Generator):
        self.dist, self.group_size, self.rng = dist, group_size, rng
        self._buf: list[list[int]] = []
        self._pos = 0

    def take(self, groups: int) -> list[list[int]]:
        """The next `groups` groups' lengths."""
        while len(self._buf) - self._pos < groups:
            block = self.dist.sample(self.rng, self.BLOCK, self.group_size).tolist()
            self._buf = self._buf[self._pos:] + block
            self._pos = 0
        out = self._buf[self._pos:self._pos + groups]
        self._pos += groups
        return out


# Default for DeepSeek-R1-Distill-Qwen models on competition math and code, chosen before any
# calibration and not fitted: median 5,000 tokens and sigma 0.9 (uncapped mean ~7,500; ~11% of
# traces reach a 15k cap, ~3% a 27k cap), half of the log-variance set by the prompt. Public
# reports put these models' average response at ~5k tokens on MATH-level and well over 10k on
# AIME-level problems, with a tail of traces that loop until the limit.
REASONING = LengthDistribution(median=5000.0, sigma=0.9, cap=27648, prompt_share=0.5)
