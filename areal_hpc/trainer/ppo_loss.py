"""The decoupled PPO objective of the AReaL paper and the SFT loss, as pure tensor functions.

    J(theta) = E_t[ w_t * min(u_t A_t, clip(u_t, 1 - eps, 1 + eps) A_t) ],
    u_t = pi_theta / pi_prox,   w_t = pi_prox / pi_behav (no gradient).

pi_behav is the policy that sampled each token (its log-probs come from the generator), pi_prox
the parameters before this training step (recomputed once per step). Tokens whose w_t exceeds the
cap are masked out; the loss is still divided by the tokens of the original mask, so masking a
token removes its contribution instead of re-weighting the others. Standard PPO is the special
case pi_prox = pi_behav (w_t = 1). Functions return token sums, so the caller can normalise over
a minibatch spread across micro-batches and data-parallel ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PPOTerms:
    """Token sums of one micro-batch (divide by `tokens` for means)."""

    loss: torch.Tensor  # sum of -objective over kept tokens, differentiable
    tokens: torch.Tensor  # tokens of the original mask
    clipped: torch.Tensor  # kept tokens where the clipped branch was taken
    capped: torch.Tensor  # tokens masked out because w_t exceeded the cap
    behav_weight: torch.Tensor  # sum of w_t over the original mask
    behav_weight_max: torch.Tensor
    approx_kl: torch.Tensor  # sum of the k3 estimate of KL(pi_prox || pi_theta) over kept tokens


def decoupled_ppo_terms(
    logprobs: torch.Tensor,
    prox_logprobs: torch.Tensor,
    behav_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    behav_cap: float | None = None,
    dual_clip: float | None = None,
) -> PPOTerms:
    """Per-token tensors of equal shape; `mask` is 1 on tokens that count (output tokens)."""
    mask = mask.to(logprobs.dtype)
    prox_logprobs, behav_logprobs = prox_logprobs.detach(), behav_logprobs.detach()
    advantages = advantages.detach()
    log_ratio = logprobs - prox_logprobs
    ratio = torch.exp(log_ratio)
    plain = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    loss = torch.maximum(plain, clipped)
    took_clip = (clipped > plain).to(mask.dtype)
    if dual_clip is not None:
        # Bound the loss of negative advantages at -dual_clip * A (dual-clip PPO).
        bound = -dual_clip * advantages
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)
    behav_weight = torch.exp(prox_logprobs - behav_logprobs)
    keep = mask
    if behav_cap is not None:
        keep = mask * (behav_weight <= behav_cap).to(mask.dtype)
    kept_loss = loss * behav_weight * keep
    kl = (ratio - 1.0 - log_ratio).detach()
    zero = torch.zeros((), dtype=mask.dtype, device=mask.device)
    return PPOTerms(
        loss=kept_loss.sum(),
        tokens=mask.sum(),
        clipped=(took_clip * keep).sum(),
        capped=(mask - keep).sum(),
        behav_weight=(behav_weight * mask).sum(),
        behav_weight_max=(behav_weight * mask).max() if mask.numel() else zero,
        approx_kl=(kl * keep).sum(),
    )


def decoupled_ppo_loss(*args, **kwargs) -> torch.Tensor:
    """Token mean of the decoupled PPO loss over the original mask (see decoupled_ppo_terms)."""
    terms = decoupled_ppo_terms(*args, **kwargs)
    return terms.loss / terms.tokens.clamp(min=1)


def sft_loss_terms(logprobs: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Negative log-likelihood summed over masked (completion) tokens, and the token count."""
    mask = mask.to(logprobs.dtype)
    return -(logprobs * mask).sum(), mask.sum()
