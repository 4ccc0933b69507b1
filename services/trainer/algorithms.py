"""RL objectives as pure tensor functions: GRPO with DAPO options, PPO with GAE, off-policy correction.

Shapes: ``B`` sequences, ``T`` positions on the completion grid of ``services.policy.batch``
(``mask[b, t] = 1`` where position t predicts a completion token). Every loss returns a *sum*;
the learner divides the accumulated gradient once per step by the batch's normaliser
(samples for ``sample_mean``, completion tokens for ``token_mean``), so micro-batches can
arrive in any order and number.

- **Advantages.** GRPO (DeepSeekMath §4.1): ``A_i = (r_i - mean r) / (std r + eps)`` over a
  group, broadcast to every token; ``dr_grpo`` drops the std (Dr. GRPO). PPO: GAE
  (Schulman et al. 2016) over per-token rewards (the outcome reward on the last completion
  token) and a critic's values.
- **Policy loss.** The clipped surrogate ``min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)``;
  ``eps_high > eps_low`` is DAPO's clip-higher. ``sample_mean`` averages tokens within a
  sample, then sums samples; ``token_mean`` (DAPO's token-level loss) sums tokens, so long
  samples weigh in proportion to their length. Optional k3 KL to a reference.
- **Off-policy correction** for stale samples (the SGS reports behaviour log-probs):

  * ``none``: ``rho = pi_theta / pi_behav`` directly; a token whose ratio left the clip range
    gives no gradient, so stale tokens are silently dropped.
  * ``tis`` (truncated importance sampling, Yao et al. 2025): ``rho = pi_theta / pi_old`` with
    ``pi_old`` the trainer's own recomputation, times ``w = min(pi_old / pi_behav, C)``.
  * ``decoupled`` (decoupled PPO, AReaL, Fu et al. 2025): ``rho = pi_theta / pi_prox`` clipped
    around the proximal policy, times ``w = pi_prox / pi_behav``; tokens with ``w > C`` are
    masked out instead of truncated.

  Braid's trainer takes exactly one optimizer step per batch, so ``pi_old`` and ``pi_prox``
  are both the weights at the start of the step (``logp.detach()`` of the same forward):
  ``rho = 1`` in value and the clip never binds; the correction is the behaviour weight
  ``w``. ``tis`` and ``decoupled`` then differ only in truncating vs masking large weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

AdvantageFn = Callable[[torch.Tensor], torch.Tensor]
_ESTIMATORS: dict[str, AdvantageFn] = {}
_ALGORITHMS = ("grpo", "ppo")

LossAgg = Literal["sample_mean", "token_mean"]
OffPolicy = Literal["none", "tis", "decoupled"]


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    def deco(fn: AdvantageFn) -> AdvantageFn:
        _ESTIMATORS[name] = fn
        return fn

    return deco


def advantage_estimator(name: str) -> AdvantageFn:
    if name not in _ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; registered: {sorted(_ESTIMATORS)}")
    return _ESTIMATORS[name]


def check_algorithm(name: str) -> str:
    if name not in _ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; registered: {list(_ALGORITHMS)}")
    return name


@register_advantage("grpo")
def grpo_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """rewards: [G] for one group -> advantages [G]; all-equal rewards give zeros."""
    centered = rewards - rewards.mean()
    return centered / (rewards.std(unbiased=False) + eps)


@register_advantage("dr_grpo")
def dr_grpo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """rewards: [G] -> advantages [G] without std scaling."""
    return rewards - rewards.mean()


def dapo_keep_group(rewards: list[float]) -> bool:
    """DAPO dynamic sampling: a group whose rewards are all equal has no learning signal."""
    return len(set(rewards)) > 1


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, loss_agg: LossAgg) -> torch.Tensor:
    """per_token, mask: [B, T] -> scalar sum (per-sample token means summed, or all tokens summed)."""
    masked = per_token * mask
    if loss_agg == "token_mean":
        return masked.sum()
    return (masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1)).sum()


@dataclass(frozen=True)
class LossStats:
    clip_fraction: float
    kl: float
    ratio_mean: float
    is_weight_mean: float
    is_capped_fraction: float


def behaviour_terms(
    logp: torch.Tensor, logp_behav: torch.Tensor, off_policy: OffPolicy, is_cap: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logp, logp_behav: [B, T] -> (ratio [B, T] with grad, weight [B, T], capped [B, T] bool)."""
    if off_policy == "none":
        ratio = torch.exp(logp - logp_behav)
        ones = torch.ones_like(logp)
        return ratio, ones, torch.zeros_like(logp, dtype=torch.bool)
    anchor = logp.detach()  # pi_old = pi_prox = the weights at the start of the step
    ratio = torch.exp(logp - anchor)
    w = torch.exp(anchor - logp_behav)
    capped = w > is_cap
    if off_policy == "tis":
        return ratio, torch.clamp(w, max=is_cap), capped
    return ratio, torch.where(capped, torch.zeros_like(w), w), capped


def policy_loss(
    logp: torch.Tensor,
    logp_behav: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float | None = None,
    loss_agg: LossAgg = "sample_mean",
    off_policy: OffPolicy = "none",
    is_cap: float = 2.0,
    logp_ref: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, LossStats]:
    """Clipped surrogate, returned as a sum (see ``aggregate``).

    logp (with grad), logp_behav, mask: [B, T]; advantages: [B] (broadcast) or [B, T];
    logp_ref: [B, T] or None.
    """
    high = clip_low if clip_high is None else clip_high
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    ratio, weight, capped = behaviour_terms(logp, logp_behav, off_policy, is_cap)
    clipped_ratio = torch.clamp(ratio, 1 - clip_low, 1 + high)
    per_token = -torch.minimum(ratio * adv, clipped_ratio * adv) * weight
    kl = torch.zeros_like(logp)
    if logp_ref is not None and kl_coef > 0:
        q = logp_ref - logp
        kl = torch.exp(q) - q - 1
        per_token = per_token + kl_coef * kl
    loss = aggregate(per_token, mask, loss_agg)
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        outside = ((ratio < 1 - clip_low) | (ratio > 1 + high)).float()
        stats = LossStats(
            clip_fraction=float((outside * mask).sum() / n),
            kl=float((kl * mask).sum() / n),
            ratio_mean=float((ratio * mask).sum() / n),
            is_weight_mean=float((weight * mask).sum() / n),
            is_capped_fraction=float((capped.float() * mask).sum() / n),
        )
    return loss, stats


def outcome_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """rewards: [B] outcome rewards -> [B, T] with each reward on its sample's last completion token."""
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=1).values
    out = torch.zeros_like(mask, dtype=torch.float32)
    rows = torch.arange(mask.shape[0])
    valid = last >= 0
    out[rows[valid], last[valid]] = rewards[valid].float()
    return out


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over right-padded completions.

    token_rewards, values, mask: [B, T] (completion tokens contiguous in each row; the state
    after the last completion token is terminal, value 0). Returns (advantages, returns), [B, T],
    zero outside the mask.
    """
    B, T = mask.shape
    adv = torch.zeros(B, T, dtype=torch.float32)
    last = torch.zeros(B, dtype=torch.float32)
    for t in reversed(range(T)):
        nxt = mask[:, t + 1] if t + 1 < T else torch.zeros(B)
        next_value = values[:, t + 1] * nxt if t + 1 < T else torch.zeros(B)
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * nxt * last
        last = last * mask[:, t]
        adv[:, t] = last
    returns = (adv + values) * mask
    return adv, returns


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float,
    loss_agg: LossAgg = "sample_mean",
) -> torch.Tensor:
    """Clipped value loss ``0.5 max((v - R)^2, (v_clip - R)^2)``; all [B, T]; returns a sum like ``aggregate``."""
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    per_token = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return aggregate(per_token, mask, loss_agg)
