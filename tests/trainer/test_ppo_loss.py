"""The decoupled PPO objective, its metrics and the SFT loss against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_hpc.trainer.ppo_loss import decoupled_ppo_loss, decoupled_ppo_terms, sft_loss_terms

log = math.log


def _t(values):
    return torch.tensor(values, dtype=torch.float64)


def hand_case():
    # token 0: u = 0.6/0.5 = 1.2, w = 1, A = +1 -> clipped branch, loss -1.1
    # token 1: u = 1, w = 0.4/0.2 = 2, A = -2 -> loss 2 * 2 = 4
    # token 2: w = 0.6/0.1 = 6 > cap 5 -> masked out
    # token 3: outside the mask (a prompt position)
    theta = _t([log(0.6), log(0.4), log(0.3), log(0.9)]).requires_grad_()
    prox = _t([log(0.5), log(0.4), log(0.6), log(0.1)])
    behav = _t([log(0.5), log(0.2), log(0.1), log(0.1)])
    adv = _t([1.0, -2.0, 1.0, 5.0])
    mask = _t([1, 1, 1, 0])
    return theta, prox, behav, adv, mask


def test_decoupled_loss_and_metrics_by_hand():
    theta, prox, behav, adv, mask = hand_case()
    terms = decoupled_ppo_terms(theta, prox, behav, adv, mask, clip_eps=0.1, behav_cap=5.0)
    assert terms.loss.item() == pytest.approx(-1.1 + 4.0)
    assert terms.tokens.item() == 3  # the capped token still counts in the denominator
    assert terms.clipped.item() == 1
    assert terms.capped.item() == 1
    assert terms.behav_weight.item() == pytest.approx(1 + 2 + 6)
    assert terms.behav_weight_max.item() == pytest.approx(6.0)
    assert terms.approx_kl.item() == pytest.approx(1.2 - 1 - log(1.2))
    loss = decoupled_ppo_loss(theta, prox, behav, adv, mask, clip_eps=0.1, behav_cap=5.0)
    assert loss.item() == pytest.approx((-1.1 + 4.0) / 3)


def test_gradient_by_hand_and_capped_tokens_contribute_nothing():
    theta, prox, behav, adv, mask = hand_case()
    decoupled_ppo_loss(theta, prox, behav, adv, mask, clip_eps=0.1, behav_cap=5.0).backward()
    # token 0 is clipped (no gradient); token 1: d/dtheta [-w A u] / 3 = -2 * -2 * 1 / 3
    assert theta.grad.tolist() == pytest.approx([0.0, 4.0 / 3, 0.0, 0.0])


def test_dual_clip_bounds_negative_advantages():
    theta, prox, behav = _t([log(0.8)]), _t([log(0.2)]), _t([log(0.2)])
    adv, mask = _t([-1.0]), _t([1.0])
    plain = decoupled_ppo_terms(theta, prox, behav, adv, mask, clip_eps=0.2)
    dual = decoupled_ppo_terms(theta, prox, behav, adv, mask, clip_eps=0.2, dual_clip=3.0)
    assert plain.loss.item() == pytest.approx(4.0)  # max(-A u, -A clip(u)) = max(4, 1.2)
    assert dual.loss.item() == pytest.approx(3.0)  # bounded at -c A


def standard_ppo(theta, old, adv, mask, eps):
    ratio = torch.exp(theta - old)
    obj = torch.minimum(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
    return -(obj * mask).sum() / mask.sum()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(-4, -0.01), st.floats(-4, -0.01), st.floats(-3, 3), st.booleans()),
                min_size=1, max_size=20))
def test_decoupled_equals_standard_ppo_when_prox_is_behav(rows):
    theta = _t([r[0] for r in rows]).requires_grad_()
    old, adv = _t([r[1] for r in rows]), _t([r[2] for r in rows])
    mask = _t([1.0 if r[3] else 0.0 for r in rows])
    if mask.sum() == 0:
        mask[0] = 1.0
    ours = decoupled_ppo_loss(theta, old, old, adv, mask, clip_eps=0.2, behav_cap=5.0)
    (g_ours,) = torch.autograd.grad(ours, theta)
    ref = standard_ppo(theta, old, adv, mask, 0.2)
    (g_ref,) = torch.autograd.grad(ref, theta)
    assert ours.item() == pytest.approx(ref.item(), abs=1e-12)
    assert torch.allclose(g_ours, g_ref, atol=1e-12)


def test_sft_loss_is_the_completion_nll():
    logprobs = _t([log(0.5), log(0.25), log(0.125)])
    nll, tokens = sft_loss_terms(logprobs, _t([0, 1, 1]))
    assert tokens.item() == 2
    assert nll.item() == pytest.approx(-(log(0.25) + log(0.125)))
