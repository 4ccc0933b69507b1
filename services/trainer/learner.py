"""The learner: gradients from complete, rewarded groups, and one optimizer step per batch.

Mechanism shared by every pipeline mode. ``backward`` takes complete groups (the samples of a
prompt with their rewards) as they become available, computes each group's per-sample signal
(the objective's ``group_signal``: GRPO advantages, or PPO's outcome rewards), then the loss in
length-bucketed micro-batches, and accumulates *unnormalised* gradients; ``step`` divides them
by the batch's normaliser (samples or completion tokens, per ``algorithm.loss_agg``), clips and
applies them. Because normalisation happens once at the step, micro-batches can arrive in any
order and number and still give the gradient of the whole batch.

Objectives (``trainer.algorithm.name``, registered in ``services.trainer.algorithms``):
``grpo`` (group advantages; DAPO's clip-higher, token-level loss, dynamic sampling) and ``ppo``
(a critic, ``services.trainer.critic``, with its own AdamW at ``critic_lr``; GAE over the
outcome reward; clipped value loss, normalised and clipped like the policy's gradient). Either
takes an off-policy correction for stale samples. With dynamic sampling, groups whose rewards
are all equal are dropped (counted in ``filtered_groups``, left out of the normaliser).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch

from services.common.config import RunConfig
from services.common.types import SampleRecord
from services.policy.batch import PackedBatch, completion_values, length_buckets, pack, token_logprobs
from services.policy.model import Policy
from services.trainer.algorithms import MicroBatch, ObjectiveParams, dapo_keep_group, get_algorithm
from services.trainer.critic import ValueModel

MICRO_BATCH_TOKENS = 4096  # padded tokens per forward/backward: bounds activation memory


@dataclass
class Group:
    """The finished samples of one prompt and their rewards (same order)."""

    samples: list[SampleRecord]
    rewards: list[float]


@dataclass
class StepStats:
    """One step's statistics. ``loss`` and ``value_loss`` are normalised at ``step``; the token
    means (clip_fraction, kl, ratio, is_weight, is_capped) are summed over micro-batches
    (divide by ``micro_batches``)."""

    trained_samples: int = 0
    zero_adv_groups: int = 0  # skipped: all-zero advantages and no KL term
    loss: float = 0.0
    clip_fraction: float = 0.0
    kl: float = 0.0
    micro_batches: int = 0
    filtered_groups: int = 0  # dropped by DAPO dynamic sampling
    ratio: float = 0.0
    is_weight: float = 0.0
    is_capped: float = 0.0
    value_loss: float = 0.0
    critic_grad_norm: float = 0.0
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
        self.objective = get_algorithm(self.algo.name)
        self.params = ObjectiveParams.from_config(tc)
        self.critic: ValueModel | None = None
        if self.objective.uses_critic:
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
            signal = self.objective.group_signal(torch.tensor(group.rewards, dtype=torch.float32), self.params)
            if self.objective.signal_is_advantage and self.ref is None and bool((signal == 0).all()):
                self.stats.zero_adv_groups += 1  # no gradient without a KL term: skip the compute
                continue
            chosen.extend(zip(group.samples, signal.tolist(), strict=True))
        lengths = [len(s.prompt_token_ids) + len(s.token_ids) for s, _ in chosen]
        for idx in length_buckets(lengths, MICRO_BATCH_TOKENS):
            self._loss_backward([chosen[i] for i in idx])
        self.stats.busy.append((t0, time.time()))

    def _weight(self, samples: list[SampleRecord]) -> float:
        if self.algo.loss_agg == "token_mean":
            return float(sum(len(s.token_ids) for s in samples))
        return float(len(samples))

    def _loss_backward(self, items: list[tuple[SampleRecord, float]]) -> None:
        """items: (sample, its group signal); one forward/backward of the policy (and critic)."""
        device = next(self.model.parameters()).device
        prompts = [list(s.prompt_token_ids) for s, _ in items]
        batch = _to(pack(prompts, [list(s.token_ids) for s, _ in items], self.policy.pad_id), device)
        behav = completion_values(batch, [len(p) for p in prompts], [list(s.logprobs) for s, _ in items])
        logp = token_logprobs(self.model, batch)
        logp_ref = None
        if self.ref is not None:
            with torch.no_grad():
                logp_ref = token_logprobs(self.ref, batch)
        mask = batch.completion_mask
        mb = MicroBatch(
            logp=logp,
            logp_behav=torch.where(mask > 0, behav, logp.detach()),  # off the completion: ratio 1, masked anyway
            mask=mask,
            signal=torch.tensor([v for _, v in items], dtype=torch.float32, device=device),
            logp_ref=logp_ref,
            values=self.critic.values(batch) if self.critic is not None else None,
        )
        out = self.objective.loss(mb, self.params)
        out.loss.backward()
        st = self.stats
        st.trained_samples += len(items)
        st.loss += out.policy_loss
        st.value_loss += out.value_loss
        st.clip_fraction += out.stats.clip_fraction
        st.kl += out.stats.kl
        st.ratio += out.stats.ratio_mean
        st.is_weight += out.stats.is_weight_mean
        st.is_capped += out.stats.is_capped_fraction
        st.micro_batches += 1

    def step(self) -> float:
        """Normalise the accumulated gradients, clip, apply; returns the policy's pre-clip gradient norm."""
        t0 = time.time()
        scale = 1.0 / self._normaliser if self._normaliser > 0 else 1.0
        max_norm = self.cfg.trainer.max_grad_norm
        grad_norm = _apply(self.model, self.opt, scale, max_norm)
        if self.critic is not None:
            self.stats.critic_grad_norm = _apply(self.critic, self.critic_opt, scale, max_norm)
        self.stats.loss *= scale
        self.stats.value_loss *= scale
        self.stats.busy.append((t0, time.time()))
        return grad_norm


def _to(batch: PackedBatch, device: torch.device) -> PackedBatch:
    return PackedBatch(batch.input_ids.to(device), batch.attention_mask.to(device), batch.completion_mask.to(device))


def _apply(module: torch.nn.Module, opt: torch.optim.Optimizer, scale: float, max_norm: float) -> float:
    """Scale the accumulated gradients by ``scale`` (the normaliser), clip to ``max_norm``, step."""
    for p in module.parameters():
        if p.grad is not None:
            p.grad.mul_(scale)
    norm = float(torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm))
    opt.step()
    return norm
