"""GRPO: group-relative advantages and the clipped policy-gradient loss (pure tensor math).

Advantages (DeepSeekMath §4.1): for a group of G samples of one prompt with rewards r,
``A_i = (r_i - mean(r)) / (std(r) + eps)`` (``grpo``), or ``r_i - mean(r)`` (``dr_grpo``,
Dr. GRPO's unbiased variant). Every token of sample i gets A_i.

Loss: the PPO clipped surrogate with the behaviour log-probs the SGS reported, so one-step
stale samples are importance-weighted and clipped:
``L_i = -mean_t min(rho_t A_i, clip(rho_t, 1-eps, 1+eps) A_i) + beta * KL_t``, with
``rho_t = exp(logp_t - logp_old_t)`` and the k3 estimator ``KL = exp(q) - q - 1`` where
``q = logp_ref - logp`` (Schulman's approximator). The per-sample mean over tokens is summed
over samples; the caller divides by the number of samples in the whole batch, so micro-batches
accumulate to the same gradient as one big batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

AdvantageFn = Callable[[torch.Tensor], torch.Tensor]
_ESTIMATORS: dict[str, AdvantageFn] = {}


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    def deco(fn: AdvantageFn) -> AdvantageFn:
        _ESTIMATORS[name] = fn
        return fn

    return deco


def advantage_estimator(name: str) -> AdvantageFn:
    if name not in _ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; registered: {sorted(_ESTIMATORS)}")
    return _ESTIMATORS[name]


@register_advantage("grpo")
def grpo_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """rewards: [G] for one group -> advantages [G]; all-equal rewards give zeros."""
    centered = rewards - rewards.mean()
    return centered / (rewards.std(unbiased=False) + eps)


@register_advantage("dr_grpo")
def dr_grpo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """rewards: [G] -> advantages [G] without std scaling."""
    return rewards - rewards.mean()


@dataclass(frozen=True)
class LossStats:
    clip_fraction: float
    kl: float
    ratio_mean: float


def policy_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float,
    logp_ref: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, LossStats]:
    """Clipped surrogate summed over samples.

    logp, logp_old, mask: [B, T] (mask 1 on completion tokens); advantages: [B];
    logp_ref: [B, T] or None. Returns (scalar loss = sum_i L_i, stats).
    """
    ratio = torch.exp(logp - logp_old)
    adv = advantages.unsqueeze(1)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    per_token = -surrogate
    kl = torch.zeros_like(logp)
    if logp_ref is not None and kl_coef > 0:
        q = logp_ref - logp
        kl = torch.exp(q) - q - 1
        per_token = per_token + kl_coef * kl
    tokens = mask.sum(dim=1).clamp(min=1)
    loss = ((per_token * mask).sum(dim=1) / tokens).sum()
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        clipped = ((ratio - 1).abs() > clip_eps).float()
        stats = LossStats(
            clip_fraction=float((clipped * mask).sum() / n),
            kl=float((kl * mask).sum() / n),
            ratio_mean=float((ratio * mask).sum() / n),
        )
    return loss, stats
