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

import time
from dataclasses import dataclass, field

import torch

from services.common.config import RunConfig
from services.common.types import SampleRecord
from services.common.weights import WeightStream
from services.policy.batch import PackedBatch, completion_values, pack, token_logprobs
from services.policy.bucketing import length_buckets
from services.policy.model import Policy
from services.trainer.algorithms import MicroBatch, ObjectiveParams, dapo_keep_group, get_algorithm
from services.trainer.backends import create_backend
from services.trainer.critic import ValueModel
from services.trainer.device import ServedWeights, compute_context
from services.trainer.parallel import ParallelContext, max_across, sum_across


@dataclass
class Group:
    """The finished samples of one prompt and their rewards (same order); ``correct``: whether each
    is correct (accuracy), None = reward 1."""

    samples: list[SampleRecord]
    rewards: list[float]
    correct: list[bool] | None = None


@dataclass
class StepStats:
    """One step's statistics. ``loss`` and ``value_loss`` are normalised at ``step``; the token
    means (clip_fraction, kl, ratio, is_weight, is_capped) are summed over micro-batches
    (divide by ``micro_batches``)."""

    trained_samples: int = 0
    zero_adv_groups: int = 0  # skipped: all-zero advantages, no KL term, trainer.skip_zero_advantage_groups
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


def group_fate(group: Group, algo, objective, params: ObjectiveParams, skip_zero: bool) -> tuple[str, list[float]]:
    """What a learner does with a complete group: ``filtered`` (DAPO's dynamic sampling: its rewards
    are all equal), ``zero`` (an all-zero advantage with ``skip_zero``, i.e.
    ``trainer.skip_zero_advantage_groups`` and no KL term: no gradient, no compute) or ``train`` with
    its per-sample signal. The real learner and the emulated one (``services.trainer.emulated``)
    both ask it, so an EMULATED step prices the groups a real one would train."""
    if algo.dynamic_sampling and not dapo_keep_group(group.rewards):
        return "filtered", []
    signal = objective.group_signal(torch.tensor(group.rewards, dtype=torch.float32), params)
    if skip_zero and objective.signal_is_advantage and bool((signal == 0).all()):
        return "zero", []
    return "train", signal.tolist()


class Learner:
    """``parallel``: this rank of a data-parallel trainer (``services.trainer.parallel``; the process
    group is up): the model is sharded over the ranks, and each call is made by every rank on its
    own groups. Gradients, the normaliser and the statistics are summed over ranks at ``step``."""

    def __init__(self, cfg: RunConfig, policy: Policy, parallel: ParallelContext | None = None) -> None:
        tc = cfg.trainer
        self.cfg = cfg
        self.policy = policy
        self.parallel = parallel
        # float32 master weights on trainer.device (cuda: this rank's GPU), in the backend's layout;
        # the KL reference is a frozen copy of the starting weights (sharded like the policy; with
        # LoRA the policy itself with its adapter disabled)
        self.algo = tc.algorithm
        self.objective = get_algorithm(self.algo.name)
        self.critic: ValueModel | None = None
        if self.objective.uses_critic:
            # a Hugging Face backbone whatever the policy's backend (its own parameters and optimizer),
            # copied before the backend wraps the policy (LoRA: the critic trains every weight)
            self.critic = ValueModel(policy.model)
        self.backend = create_backend(cfg, policy, parallel)
        self.device = self.backend.device
        self.ref = self.backend.ref
        self.model = self.backend.module.train()
        # what the optimizer steps and clipping sees: every parameter, or with LoRA the adapter's
        self.trainable = self.backend.trainable()
        self.opt = torch.optim.AdamW(self.trainable, lr=tc.lr, weight_decay=tc.weight_decay)
        # versions served rounded (weights.dtype): forward/backward at that rounding, steps on the masters
        self.served = ServedWeights(self.trainable, cfg.weights.dtype)
        self.params = ObjectiveParams.from_config(tc)
        self.skip_zero_adv = tc.skip_zero_advantage_groups
        if self.critic is not None:
            self.critic = self.critic.to(device=self.device, dtype=torch.float32).train()
            if tc.activation_checkpointing:
                self.critic.backbone.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": False}
                )
            self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=self.algo.critic_lr)
        self._normaliser = 0.0
        self.stats = StepStats()
        # the policy is the distribution the SGS samples from: logits / generation.temperature
        self.temperature = cfg.generation.temperature

    def begin(self) -> StepStats:
        """Start a new batch: clear gradients and statistics."""
        self.served.leave()  # a batch left without its step: the masters back
        self.opt.zero_grad(set_to_none=True)
        if self.critic is not None:
            self.critic_opt.zero_grad(set_to_none=True)
        self._normaliser = 0.0
        self.stats = StepStats()
        return self.stats

    def backward(self, groups: list[Group]) -> None:
        """Forward/backward complete groups; gradients accumulate until ``step``."""
        t0 = time.time()
        self.served.enter()
        chosen: list[tuple[SampleRecord, float]] = []
        for group in groups:
            fate, signal = group_fate(group, self.algo, self.objective, self.params,
                                      self.skip_zero_adv and self.ref is None)
            if fate == "filtered":
                self.stats.filtered_groups += 1
                continue
            self._normaliser += self._weight(group.samples)
            if fate == "zero":
                self.stats.zero_adv_groups += 1  # no gradient without a KL term: skip the compute
                continue
            chosen.extend(zip(group.samples, signal, strict=True))
        lengths = [len(s.prompt_token_ids) + len(s.token_ids) for s, _ in chosen]
        buckets = length_buckets(lengths, self.cfg.trainer.micro_batch_tokens)
        # data parallel: every rank makes as many passes as the busiest (agreed before any pass)
        passes = len(buckets) if self.parallel is None else max_across(len(buckets))
        for idx in buckets:
            self._loss_backward([chosen[i] for i in idx])
        for _ in range(passes - len(buckets)):
            self._idle_pass()
        self.stats.busy.append((t0, time.time()))

    def _idle_pass(self) -> None:
        """A forward/backward that adds nothing (loss x 0): FSDP's all-gathers and reduce-scatters
        need every rank in every pass."""
        ids = torch.full((1, 2), self.policy.pad_id, dtype=torch.long, device=self.device)
        batch = PackedBatch(ids, torch.ones_like(ids), torch.zeros(1, 2, device=self.device))
        with compute_context(self.device, self.cfg.trainer.dtype):
            if self.ref is not None:  # its all-gathers too
                with torch.no_grad():
                    token_logprobs(self.ref, batch)
            logp = token_logprobs(self.model, batch)
        (logp.sum() * 0.0).backward()

    def _weight(self, samples: list[SampleRecord]) -> float:
        if self.algo.loss_agg == "token_mean":
            return float(sum(s.trained_tokens for s in samples))
        return float(len(samples))

    def _loss_backward(self, items: list[tuple[SampleRecord, float]]) -> None:
        """items: (sample, its group signal); one forward/backward of the policy (and critic)."""
        device = self.device
        prompts = [list(s.prompt_token_ids) for s, _ in items]
        masks = [s.loss_mask for s, _ in items] if any(s.loss_mask for s, _ in items) else None
        batch = _to(pack(prompts, [list(s.token_ids) for s, _ in items], self.policy.pad_id, masks), device)
        behav = completion_values(batch, [len(p) for p in prompts], [list(s.logprobs) for s, _ in items])
        logp_ref, values = None, None
        with compute_context(device, self.cfg.trainer.dtype):  # log-probs and values come out float32
            if self.ref is not None:  # first: a LoRA reference toggles the adapter, before the graph holds it
                with torch.no_grad():
                    logp_ref = token_logprobs(self.ref, batch, self.temperature)
            logp = token_logprobs(self.model, batch, self.temperature)
            if self.critic is not None:
                values = self.critic.values(batch)
        mask = batch.completion_mask
        mb = MicroBatch(
            logp=logp,
            logp_behav=torch.where(mask > 0, behav, logp.detach()),  # off the completion: ratio 1, masked anyway
            mask=mask,
            signal=torch.tensor([v for _, v in items], dtype=torch.float32, device=device),
            logp_ref=logp_ref,
            values=values,
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
        normaliser, ranks = self._normaliser, 1
        if self.parallel is not None:
            normaliser, ranks = self._sum_stats(), self.parallel.world
        scale = 1.0 / normaliser if normaliser > 0 else 1.0
        max_norm = self.cfg.trainer.max_grad_norm
        self.served.leave()  # the gradients taken at the served rounding step the float32 masters
        # FSDP averaged the gradients over ranks: x ranks makes them the sum the normaliser divides
        grad_norm = _apply(self.trainable, self.opt, scale * ranks, max_norm)
        if self.critic is not None:
            self.stats.critic_grad_norm = _apply(list(self.critic.parameters()), self.critic_opt, scale, max_norm)
        self.stats.loss *= scale
        self.stats.value_loss *= scale
        self.stats.busy.append((t0, time.time()))
        return grad_norm

    def _sum_stats(self) -> float:
        """Sum this step's statistics and normaliser over the ranks; returns the normaliser."""
        st = self.stats
        *totals, normaliser = sum_across([*(float(getattr(st, n)) for n in _SUMMED), self._normaliser])
        for n, v in zip(_SUMMED, totals, strict=True):
            setattr(st, n, type(getattr(st, n))(v))
        return normaliser

    def state(self) -> dict | None:
        """Everything a recovery checkpoint needs to continue this learner exactly: the module's
        and the optimizer's state (and the critic's). Data parallel: gathered full on rank 0 (a
        collective every rank makes; None on the others); keyed by parameter name there, by
        parameter index with one process, so a checkpoint resumes under the same ``ranks``. With
        LoRA one process keeps only the adapter's module state (``_module_state``); data parallel
        keeps the full module (the base too) as gathered."""
        self.served.leave()  # the masters, not the served rounding (a later backward rounds again)
        if self.parallel is None:
            state = {"module": self._module_state(), "opt": self.opt.state_dict()}
            if self.critic is not None:
                state |= {"critic": self.critic.state_dict(), "critic_opt": self.critic_opt.state_dict()}
            return state
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        module, opt = get_state_dict(self.model, self.opt,
                                     options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {"module": module, "opt": opt} if self.parallel.leader else None

    def _module_state(self) -> dict[str, torch.Tensor]:
        """The module's state a checkpoint keeps: all of it, or with LoRA the trained (adapter)
        parameters only (the frozen base is the checkpoint the run started from)."""
        state = self.model.state_dict()
        if self.cfg.trainer.lora is None:
            return state
        trained = {n for n, p in self.model.named_parameters() if p.requires_grad}
        return {k: v for k, v in state.items() if k in trained}

    def _load_module(self, state: dict[str, torch.Tensor]) -> None:
        if self.cfg.trainer.lora is None:
            self.model.load_state_dict(state)
            return
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        trained = {n for n, p in self.model.named_parameters() if p.requires_grad}
        if unexpected or trained & set(missing):
            raise ValueError(f"the checkpoint's module state does not fit this LoRA model: unexpected "
                             f"{sorted(unexpected)[:4]}, missing {sorted(trained & set(missing))[:4]}")

    def load_state(self, state: dict | None) -> None:
        """Install ``state()``'s result. Data parallel: every rank calls it, rank 0 with the state
        (the others with None); each takes its shard from rank 0's broadcast."""
        if self.parallel is None:
            assert state is not None
            self._load_module(state["module"])
            self.opt.load_state_dict(state["opt"])
            if self.critic is not None:
                self.critic.load_state_dict(state["critic"])
                self.critic_opt.load_state_dict(state["critic_opt"])
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        # two calls, not set_state_dict: given an empty model dict (the followers) it skips the
        # model's broadcast, which rank 0 then waits on
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(self.model, state["module"] if state else {}, options=options)
        set_optimizer_state_dict(self.model, self.opt, state["opt"] if state else {}, options=options)

    def weights(self) -> WeightStream:
        """The policy's weights by Hugging Face name (with LoRA the adapter's, peft's names), tensor by
        tensor (``backends``): one process on the torch backend hands out the live tensors (the weight
        transport copies them out); data parallel, each is all-gathered as it is drawn, a collective
        every rank makes in the same order, so no rank holds more than one full tensor at a time
        besides what the consumer keeps."""
        return self.backend.weights()


_SUMMED = ("trained_samples", "zero_adv_groups", "loss", "clip_fraction", "kl", "micro_batches", "filtered_groups",
           "ratio", "is_weight", "is_capped", "value_loss")


def _to(batch: PackedBatch, device: torch.device) -> PackedBatch:
    return PackedBatch(batch.input_ids.to(device), batch.attention_mask.to(device), batch.completion_mask.to(device))


def _apply(params: list[torch.nn.Parameter], opt: torch.optim.Optimizer, scale: float, max_norm: float) -> float:
    """Scale the accumulated gradients of ``params`` (what ``opt`` steps) by ``scale`` (the
    normaliser), clip to ``max_norm``, step."""
    for p in params:
        if p.grad is not None:
            p.grad.mul_(scale)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    total = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # sharded: the global norm
    opt.step()
    return total
