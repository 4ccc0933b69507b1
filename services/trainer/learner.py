"""The learner: gradients from complete, rewarded groups, and one optimizer step per batch.

Mechanism shared by every pipeline mode. ``backward`` takes complete groups (the samples of a
prompt with their rewards) as they become available, computes advantages and the policy loss
in length-bucketed micro-batches, and accumulates *unnormalised* gradients; ``step`` divides
them by the batch's normaliser (samples or completion tokens, per ``algorithm.loss_agg``),
clips and applies them. Because normalisation happens once at the step, micro-batches can
arrive in any order and number and still give the gradient of the whole batch.

Objectives (``trainer.algorithm``, see ``services.trainer.algorithms``): ``grpo`` (group
advantages, DAPO's clip-higher / token-level loss / dynamic sampling) and ``ppo`` (a critic,
``services.trainer.critic``, with its own AdamW; GAE over the outcome reward; clipped value
loss, normalised and clipped like the policy's gradient). Either takes an off-policy
correction for stale samples. With dynamic sampling, groups whose rewards are all equal are
dropped (and left out of the normaliser).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch

from services.common.config import RunConfig
from services.common.types import SampleRecord
from services.policy.batch import completion_values, length_buckets, pack, token_logprobs
from services.policy.model import Policy
from services.trainer.algorithms import (
    advantage_estimator,
    check_algorithm,
    dapo_keep_group,
    gae,
    outcome_rewards,
    policy_loss,
    value_loss,
)
from services.trainer.critic import ValueModel

MICRO_BATCH_TOKENS = 4096  # padded tokens per forward/backward: bounds activation memory


@dataclass
class Group:
    """The finished samples of one prompt and their rewards (same order)."""

    samples: list[SampleRecord]
    rewards: list[float]


@dataclass
class StepStats:
    trained_samples: int = 0
    zero_adv_groups: int = 0
    loss: float = 0.0
    clip_fraction: float = 0.0
    kl: float = 0.0
    micro_batches: int = 0
    filtered_groups: int = 0
    is_weight: float = 0.0
    is_capped: float = 0.0
    value_loss: float = 0.0
    busy: list[tuple[float, float]] = field(default_factory=list)


class Learner:
    def __init__(self, cfg: RunConfig, policy: Policy) -> None:
        tc = cfg.trainer
        self.cfg = cfg
        self.policy = policy
        self.model = policy.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
        self.ref = copy.deepcopy(self.model).eval().requires_grad_(False) if tc.kl_coef > 0 else None
        self.algo = tc.algorithm
        self.advantages = advantage_estimator(self.algo.advantage)
        self.critic: ValueModel | None = None
        if check_algorithm(self.algo.name) == "ppo":
            self.critic = ValueModel(self.model).train()
            self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=self.algo.critic_lr)
        self._normaliser = 0.0
        self.stats = StepStats()

    def begin(self) -> StepStats:
        """Start a new batch: clear gradients and statistics."""
        self.opt.zero_grad(set_to_none=True)
        if self.critic is not None:
            self.critic_opt.zero_grad(set_to_none=True)
        self._normaliser = 0.0
        self.stats = StepStats()
        return self.stats

    def backward(self, groups: list[Group]) -> None:
        """Forward/backward complete groups; gradients accumulate until ``step``."""
        t0 = time.time()
        chosen: list[tuple[SampleRecord, float]] = []
        for group in groups:
            if self.algo.dynamic_sampling and not dapo_keep_group(group.rewards):
                self.stats.filtered_groups += 1
                continue
            self._normaliser += self._weight(group.samples)
            if self.critic is not None:  # ppo: the per-sample value is the outcome reward
                chosen.extend(zip(group.samples, group.rewards))
                continue
            adv = self.advantages(torch.tensor(group.rewards, dtype=torch.float32))
            if self.ref is None and bool((adv == 0).all()):
                self.stats.zero_adv_groups += 1  # no gradient without a KL term: skip the compute
                continue
            chosen.extend(zip(group.samples, adv.tolist()))
        lengths = [len(s.prompt_token_ids) + len(s.token_ids) for s, _ in chosen]
        for idx in length_buckets(lengths, MICRO_BATCH_TOKENS):
            self._loss_backward([chosen[i] for i in idx])
        self.stats.busy.append((t0, time.time()))

    def _weight(self, samples: list[SampleRecord]) -> float:
        if self.cfg.trainer.algorithm.loss_agg == "token_mean":
            return float(sum(len(s.token_ids) for s in samples))
        return float(len(samples))

    def _loss_backward(self, items: list[tuple[SampleRecord, float]]) -> None:
        """items: (sample, advantage) for grpo, (sample, outcome reward) for ppo."""
        tc = self.cfg.trainer
        prompts = [list(s.prompt_token_ids) for s, _ in items]
        comps = [list(s.token_ids) for s, _ in items]
        batch = pack(prompts, comps, self.policy.pad_id)
        logp_old = completion_values(batch, [len(p) for p in prompts], [list(s.logprobs) for s, _ in items])
        logp = token_logprobs(self.model, batch)
        logp_ref = None
        if self.ref is not None:
            with torch.no_grad():
                logp_ref = token_logprobs(self.ref, batch)
        # positions outside the completion carry logp_old = 0; the mask removes them
        logp_old = torch.where(batch.completion_mask > 0, logp_old, logp.detach())
        mask = batch.completion_mask
        values = torch.tensor([a for _, a in items], dtype=torch.float32)
        if self.critic is not None:
            advantages = self._critic_backward(batch, values)
        else:
            advantages = values
        loss, stats = policy_loss(
            logp, logp_old, advantages, mask, clip_low=tc.clip_eps, clip_high=self.algo.clip_high,
            loss_agg=self.algo.loss_agg, off_policy=self.algo.off_policy, is_cap=self.algo.is_cap,
            logp_ref=logp_ref, kl_coef=tc.kl_coef,
        )
        loss.backward()
        self.stats.is_weight += stats.is_weight_mean
        self.stats.is_capped += stats.is_capped_fraction
        self.stats.trained_samples += len(items)
        self.stats.loss += float(loss.detach())
        self.stats.clip_fraction += stats.clip_fraction
        self.stats.kl += stats.kl
        self.stats.micro_batches += 1

    def _critic_backward(self, batch, rewards: torch.Tensor) -> torch.Tensor:
        """PPO: values, GAE advantages [B, T] (returned, no grad) and the value-loss backward."""
        assert self.critic is not None
        mask = batch.completion_mask
        values = self.critic.values(batch)
        old = values.detach()
        adv, returns = gae(outcome_rewards(rewards, mask), old, mask, self.algo.gamma, self.algo.lam)
        vloss = self.algo.vf_coef * value_loss(values, old, returns, mask, self.algo.value_clip, self.algo.loss_agg)
        vloss.backward()
        self.stats.value_loss += float(vloss.detach())
        return adv

    def step(self) -> float:
        """Normalise the accumulated gradients, clip, apply; returns the policy's pre-clip gradient norm."""
        t0 = time.time()
        scale = 1.0 / self._normaliser if self._normaliser > 0 else 1.0
        grad_norm = _apply(self.model, self.opt, scale, self.cfg.trainer.max_grad_norm)
        if self.critic is not None:
            _apply(self.critic, self.critic_opt, scale, self.cfg.trainer.max_grad_norm)
            self.stats.value_loss *= scale
        self.stats.loss *= scale
        self.stats.busy.append((t0, time.time()))
        return grad_norm


def _apply(module: torch.nn.Module, opt: torch.optim.Optimizer, scale: float, max_norm: float) -> float:
    for p in module.parameters():
        if p.grad is not None:
            p.grad.mul_(scale)
    norm = float(torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm))
    opt.step()
    return norm
