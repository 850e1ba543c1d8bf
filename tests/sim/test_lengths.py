"""Generation lengths: the cap, the tail, correlation within a prompt's group, reproducibility."""

from __future__ import annotations

import numpy as np
import pytest

from areal_hpc.errors import UserError
from areal_hpc.sim.lengths import REASONING, LengthDistribution, LengthStream


def test_lengths_are_capped_and_the_cap_share_matches_the_tail():
    dist = LengthDistribution(median=5000, sigma=0.9, cap=15360)
    x = dist.sample(np.random.default_rng(0), 20000, 1)
    assert x.min() >= 1 and x.max() == 15360
    assert np.median(x) == pytest.approx(5000, rel=0.03)
    assert (x == 15360).mean() == pytest.approx(dist.capped_fraction(), abs=0.01)
    # by hand: z = ln(15360 / 5000) / 0.9 = 1.247, P(Z > z) = 0.106
    assert dist.capped_fraction() == pytest.approx(0.106, abs=0.002)


def test_samples_of_one_prompt_are_correlated_by_prompt_share():
    rng = np.random.default_rng(1)
    for share in (0.0, 0.5, 0.9):
        x = np.log(LengthDistribution(1000, 0.5, 10**9, share).sample(rng, 4000, 2))
        corr = np.corrcoef(x[:, 0], x[:, 1])[0, 1]
        assert corr == pytest.approx(share, abs=0.05)


def test_stream_gives_the_same_lengths_whatever_the_request_sizes():
    one = LengthStream(REASONING, 16, np.random.default_rng(3))
    many = LengthStream(REASONING, 16, np.random.default_rng(3))
    singles = [one.take(1)[0] for _ in range(600)]
    assert singles == many.take(300) + many.take(300)
    assert all(len(g) == 16 for g in singles)


def test_bad_distribution_is_a_user_error():
    with pytest.raises(UserError, match="median > 0"):
        LengthDistribution(median=0, sigma=1, cap=10)
