"""Three steps, a checkpoint, and fresh processes resume exactly where the run stopped (dp=2,
distributed optimizer: the optimizer state is sharded across the two ranks)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow


def test_resumed_steps_equal_the_uninterrupted_run(resume_runs):
    uninterrupted, resumed = resume_runs
    for a, b in zip(uninterrupted, resumed, strict=True):
        assert b["version"] == 3
        assert len(a["before"]) == 3 and a["before"][0] != a["before"][1]
        for key in ("loss", "grad_norm", "importance_weight_mean", "approx_kl", "clip_fraction", "version"):
            assert [m[key] for m in b["after"]] == [m[key] for m in a["after"]], key
    weights_a, weights_b = uninterrupted[0]["weights"], resumed[0]["weights"]
    assert weights_a and sorted(weights_a) == sorted(weights_b)
    for name, tensor in weights_a.items():
        assert torch.equal(weights_b[name], tensor), name
