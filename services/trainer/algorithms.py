"""RL objectives as pure tensor functions: GRPO with DAPO options, PPO with GAE, off-policy correction.

Shapes: ``B`` sequences, ``T`` positions on the completion grid of ``services.policy.batch``
(``mask[b, t] = 1`` where position t predicts a completion token; right-padded, so each row's
completion tokens are contiguous). Every loss returns a *sum*; the learner divides the
accumulated gradient once per step by the batch's normaliser (samples for ``sample_mean``,
completion tokens for ``token_mean``), so micro-batches can arrive in any order and number.

- **Objectives** (registry: ``register_algorithm`` / ``get_algorithm``). Each names a
  per-group *signal* (computed when a group is complete, before micro-batching) and a loss
  over one micro-batch. ``grpo``: the signal is the group advantage, broadcast to every token.
  ``ppo``: the signal is the outcome reward; a critic's values give GAE advantages per token.
- **Advantages.** GRPO (Shao et al. 2024, DeepSeekMath §4.1.2): ``A_i = (r_i - mean r) /
  (std r + eps)`` over a group; ``dr_grpo`` drops the std (Liu et al. 2025, Dr. GRPO). PPO:
  GAE (Schulman et al. 2016) over per-token rewards (the outcome reward on the last completion
  token; the state after it is terminal). PPO advantages are not whitened over the batch:
  that would need the whole batch before the first backward and break the micro-batch contract.
- **Policy loss.** The clipped surrogate ``-min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)``;
  ``eps_high > eps_low`` is DAPO's clip-higher (Yu et al. 2025, §3.1). ``sample_mean``
  averages tokens within a sample, then sums samples; ``token_mean`` (DAPO §3.3) sums tokens,
  so long samples weigh in proportion to their length. Optional k3 KL to a reference
  (``exp(q) - q - 1``, ``q = log pi_ref - log pi_theta``).
- **Value loss.** ``0.5 max((v - R)^2, (v_old + clip(v - v_old, -c, c) - R)^2)``, aggregated
  like the policy loss.
- **Off-policy correction** for stale samples. The SGS reports behaviour log-probs
  ``pi_behav``; they differ from the trainer's policy by the version lag (bounded asynchrony)
  and by inference-vs-training numerics.

  * ``none``: ``rho = pi_theta / pi_behav`` (the behaviour policy plays PPO's old policy).
    The gradient is ``rho A grad log pi_theta`` unless the clip binds: for ``A > 0`` a token
    with ``rho > 1 + eps_high`` gives no gradient (one with ``rho < 1 - eps_low`` keeps weight
    ``rho``); for ``A < 0`` a token with ``rho < 1 - eps_low`` gives none and one with
    ``rho > 1 + eps_high`` keeps its *unbounded* weight ``rho``. Staleness thus both drops
    tokens and lets large weights through.
  * ``tis`` (truncated importance sampling, Yao et al. 2025): ``rho = pi_theta / pi_old`` with
    ``pi_old`` the trainer's own recomputation, times ``w = min(pi_old / pi_behav, C)``.
  * ``decoupled`` (decoupled PPO, AReaL, Fu et al. 2025, §5): ``rho = pi_theta / pi_prox``
    clipped around the proximal policy, times ``w = pi_prox / pi_behav``; tokens with ``w > C``
    are masked out instead of truncated.

  Braid's trainer takes exactly one optimizer step per batch and its parameters do not change
  between micro-batches, so ``pi_old`` and ``pi_prox`` are both the weights at the start of
  the step, i.e. ``logp.detach()`` of the same forward. Then ``rho = 1`` in value, the clip
  (``clip_eps``, ``clip_high``) never binds and clip_fraction is 0: the update is the
  importance-weighted policy gradient ``-w A grad log pi_theta``. ``tis`` and ``decoupled``
  differ only in truncating vs masking weights above ``C``; the clip would matter only with
  several optimizer steps per batch. Likewise PPO's value clip is around the values at the
  start of the step (the same forward), so it does not bind either.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:
    from services.common.config import TrainerConfig

AdvantageFn = Callable[[torch.Tensor], torch.Tensor]
LossAgg = Literal["sample_mean", "token_mean"]
OffPolicy = Literal["none", "tis", "decoupled"]

_ESTIMATORS: dict[str, AdvantageFn] = {}


# ---------------------------------------------------------------- group advantages
def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    if name in _ESTIMATORS:
        raise ValueError(f"advantage estimator {name!r} is already registered")

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
    """rewards: [G] -> advantages [G] without std scaling (Dr. GRPO)."""
    return rewards - rewards.mean()


def dapo_keep_group(rewards: list[float]) -> bool:
    """DAPO dynamic sampling (§3.2): a group whose rewards are all equal has no learning signal."""
    return len(set(rewards)) > 1


# ---------------------------------------------------------------- policy loss
def aggregate(per_token: torch.Tensor, mask: torch.Tensor, loss_agg: LossAgg) -> torch.Tensor:
    """per_token, mask: [B, T] -> scalar sum (per-sample token means summed, or all tokens summed)."""
    masked = per_token * mask
    if loss_agg == "token_mean":
        return masked.sum()
    return (masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1)).sum()


@dataclass(frozen=True)
class LossStats:
    """Token means over the micro-batch's completion tokens."""

    clip_fraction: float  # ratio outside [1 - eps_low, 1 + eps_high]
    kl: float  # k3 estimate of KL(pi_theta || pi_ref); 0 without a reference
    ratio_mean: float
    is_weight_mean: float  # behaviour weight w after truncation/masking (1 for 'none')
    is_capped_fraction: float  # tokens with pi_old / pi_behav > C


def behaviour_terms(
    logp: torch.Tensor, logp_behav: torch.Tensor, off_policy: OffPolicy, is_cap: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logp (with grad), logp_behav: [B, T] -> (ratio [B, T] with grad, weight [B, T], capped [B, T] bool)."""
    if off_policy == "none":
        ratio = torch.exp(logp - logp_behav)
        return ratio, torch.ones_like(logp), torch.zeros_like(logp, dtype=torch.bool)
    anchor = logp.detach()  # pi_old = pi_prox = the weights at the start of the step
    ratio = torch.exp(logp - anchor)
    w = torch.exp(anchor - logp_behav)
    capped = w > is_cap
    if off_policy == "tis":
        return ratio, torch.clamp(w, max=is_cap), capped
    if off_policy == "decoupled":
        return ratio, torch.where(capped, torch.zeros_like(w), w), capped
    raise ValueError(f"unknown off-policy correction {off_policy!r}; known: ['none', 'tis', 'decoupled']")


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
    """Clipped surrogate (+ k3 KL), returned as a sum (see ``aggregate``).

    logp (with grad), logp_behav, mask: [B, T]; advantages: [B] (broadcast to tokens) or [B, T];
    logp_ref: [B, T] or None. ``clip_high=None`` means symmetric clipping.
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


# ---------------------------------------------------------------- PPO: GAE and value loss
def outcome_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """rewards: [B] outcome rewards -> [B, T] with each reward on its sample's last completion token."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=1).values
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = torch.arange(mask.shape[0], device=mask.device)
    valid = last >= 0
    out[rows[valid], last[valid]] = rewards.to(out)[valid]
    return out


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over right-padded completions.

    token_rewards, values, mask: [B, T], completion tokens contiguous in each row; the state
    after a row's last completion token is terminal (value 0). ``delta_t = r_t + gamma
    V_{t+1} - V_t``, ``A_t = delta_t + gamma lam A_{t+1}``. Returns (advantages, returns =
    advantages + values), both [B, T] float32 and zero outside the mask.
    """
    B, T = mask.shape
    values = values.float()
    adv = torch.zeros(B, T, dtype=torch.float32, device=mask.device)
    running = torch.zeros(B, dtype=torch.float32, device=mask.device)
    for t in reversed(range(T)):
        if t + 1 < T:
            cont = mask[:, t + 1]  # 0 past the last completion token: terminal
            next_value = values[:, t + 1] * cont
        else:
            cont = next_value = torch.zeros(B, dtype=torch.float32, device=mask.device)
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * cont * running) * mask[:, t]
        adv[:, t] = running
    return adv, (adv + values) * mask


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    loss_agg: LossAgg = "sample_mean",
) -> torch.Tensor:
    """Clipped value loss ``0.5 max((v - R)^2, (v_clip - R)^2)``; all [B, T]; a sum like ``aggregate``."""
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    per_token = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return aggregate(per_token, mask, loss_agg)


# ---------------------------------------------------------------- objectives registry
@dataclass(frozen=True)
class ObjectiveParams:
    """The objectives' knobs, from ``trainer`` and ``trainer.algorithm`` (see ``from_config``)."""

    clip_low: float = 0.2
    clip_high: float | None = None
    loss_agg: LossAgg = "sample_mean"
    off_policy: OffPolicy = "none"
    is_cap: float = 2.0
    kl_coef: float = 0.0
    advantage: str = "grpo"
    gamma: float = 1.0
    lam: float = 0.95
    vf_coef: float = 0.5
    value_clip: float = 0.2

    @staticmethod
    def from_config(tc: TrainerConfig) -> ObjectiveParams:
        a = tc.algorithm
        return ObjectiveParams(
            clip_low=tc.clip_eps, clip_high=a.clip_high, loss_agg=a.loss_agg, off_policy=a.off_policy,
            is_cap=a.is_cap, kl_coef=tc.kl_coef, advantage=a.advantage, gamma=a.gamma, lam=a.lam,
            vf_coef=a.vf_coef, value_clip=a.value_clip,
        )


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch on the completion grid: [B, T] tensors, ``signal`` [B]."""

    logp: torch.Tensor  # policy log-probs, with grad
    logp_behav: torch.Tensor  # behaviour log-probs from the SGS
    mask: torch.Tensor  # completion mask
    signal: torch.Tensor  # [B] per-sample output of the objective's group_signal
    logp_ref: torch.Tensor | None = None  # reference log-probs when kl_coef > 0
    values: torch.Tensor | None = None  # critic values, with grad (objectives with uses_critic)


@dataclass(frozen=True)
class ObjectiveOutput:
    loss: torch.Tensor  # the sum to backpropagate (policy + vf_coef * value loss)
    policy_loss: float  # the policy part (incl. KL), a sum
    value_loss: float  # the unscaled value loss, a sum (0 without a critic)
    stats: LossStats


SignalFn = Callable[[torch.Tensor, ObjectiveParams], torch.Tensor]
LossFn = Callable[[MicroBatch, ObjectiveParams], ObjectiveOutput]


@dataclass(frozen=True)
class Objective:
    """A registered RL objective: what the learner needs to run it."""

    name: str
    uses_critic: bool  # the learner owns a ValueModel and passes its values in MicroBatch.values
    signal_is_advantage: bool  # an all-zero group signal gives no policy gradient (without KL): skippable
    group_signal: SignalFn  # rewards [G] of one complete group -> per-sample signal [G]
    loss: LossFn


_ALGORITHMS: dict[str, Objective] = {}


def register_algorithm(
    name: str, *, uses_critic: bool, signal_is_advantage: bool, group_signal: SignalFn
) -> Callable[[LossFn], LossFn]:
    if name in _ALGORITHMS:
        raise ValueError(f"algorithm {name!r} is already registered")

    def deco(fn: LossFn) -> LossFn:
        _ALGORITHMS[name] = Objective(name, uses_critic, signal_is_advantage, group_signal, fn)
        return fn

    return deco


def get_algorithm(name: str) -> Objective:
    if name not in _ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; registered: {sorted(_ALGORITHMS)}")
    return _ALGORITHMS[name]


def _surrogate(mb: MicroBatch, advantages: torch.Tensor, p: ObjectiveParams) -> tuple[torch.Tensor, LossStats]:
    return policy_loss(
        mb.logp, mb.logp_behav, advantages, mb.mask, clip_low=p.clip_low, clip_high=p.clip_high,
        loss_agg=p.loss_agg, off_policy=p.off_policy, is_cap=p.is_cap, logp_ref=mb.logp_ref, kl_coef=p.kl_coef,
    )


def _group_advantages(rewards: torch.Tensor, p: ObjectiveParams) -> torch.Tensor:
    return advantage_estimator(p.advantage)(rewards)


def _outcome(rewards: torch.Tensor, p: ObjectiveParams) -> torch.Tensor:
    return rewards  # PPO: the critic, not the group, supplies the baseline


@register_algorithm("grpo", uses_critic=False, signal_is_advantage=True, group_signal=_group_advantages)
def grpo_objective(mb: MicroBatch, p: ObjectiveParams) -> ObjectiveOutput:
    """GRPO / DAPO: the clipped surrogate with each sample's group advantage ``mb.signal`` [B]."""
    loss, stats = _surrogate(mb, mb.signal, p)
    return ObjectiveOutput(loss, float(loss.detach()), 0.0, stats)


@register_algorithm("ppo", uses_critic=True, signal_is_advantage=False, group_signal=_outcome)
def ppo_objective(mb: MicroBatch, p: ObjectiveParams) -> ObjectiveOutput:
    """PPO: GAE advantages [B, T] from the outcome rewards ``mb.signal`` [B] and the critic's
    values ``mb.values`` [B, T] (detached for GAE), the clipped surrogate, and the clipped value loss."""
    if mb.values is None:
        raise ValueError("ppo needs the critic's values (MicroBatch.values is None)")
    old = mb.values.detach()
    adv, returns = gae(outcome_rewards(mb.signal, mb.mask), old, mb.mask, p.gamma, p.lam)
    ploss, stats = _surrogate(mb, adv, p)
    vloss = value_loss(mb.values, old, returns, mb.mask, p.value_clip, p.loss_agg)
    return ObjectiveOutput(ploss + p.vf_coef * vloss, float(ploss.detach()), float(vloss.detach()), stats)
