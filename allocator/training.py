"""Training cost model: one RL training step of a global batch on y GPUs of one kind, and the
parallel-config search over DP x TP x PP (StreamRL §4.2 "Parallel configuration").

Step time of a config (dp, tp, pp) on a workload of ``tokens`` tokens (prompts + responses of
the whole global batch), roofline style:

- **compute**: ``fwd_equivalents x (2 N_matmul tokens + 2 h layers sum(L^2))`` FLOPs over all
  GPUs at ``MFU`` of the BF16 peak. A training pass with full recomputation costs 4 forward
  passes (forward, recomputed forward, backward = 2 forwards), a forward-only pass 1: GRPO
  (policy training + reference log-probs) = 5, PPO (actor and critic training + reference and
  value forwards) = 10. ``2 h layers L^2`` is causal attention over a sequence of length L
  (QK^T and AV, half the square), which matters at 20K tokens.
  ``MFU = 0.40``: Megatron-LM reaches 0.4-0.5 model FLOPs utilisation on dense GPT training on
  A100/H100 (Narayanan et al. 2021, Korthikanti et al. 2022 report 52-56% hardware FLOPs
  utilisation with recomputation counted); RL training with variable-length sequences is
  below that, so 0.40 for the useful FLOPs.
- **TP**: 2 all-reduces per layer per forward-equivalent (attention and MLP outputs, Megatron's
  g/g-bar operators), each of ``tokens/dp x h x 2`` bytes with ring volume 2(tp-1)/tp, over
  NVLink (TP stays inside a node), not overlapped.
- **PP**: the 1F1B bubble stretches compute and TP time by ``(pp-1)/m`` with m micro-batches per
  replica (``ceil(tokens / dp / mb_tokens)``); point-to-point activations ``mb_tokens x h x 2``
  bytes per stage boundary and forward-equivalent, over the inter-node network once ``tp x pp``
  exceeds a node.
- **DP**: ZeRO-1 reduce-scatter of bf16 gradients + all-gather of updated weights, ring volume
  ``2 (dp-1)/dp x 2 N / (tp pp)`` bytes per trained model, over the inter-node network per
  GPU; counted as exposed (no overlap with the backward pass: conservative).

``search`` tries every (tp, pp) with tp in {1, 2, 4, 8} within a node and dividing the head
counts, pp in {1, 2, 4, 8, 16} up to the layer count, dp = y / (tp pp); drops the configs whose
memory (``allocator.memory``) does not fit; returns the fastest, or the closest miss (needed
vs available GB per GPU) when nothing fits. Pure: no I/O.

**Measured profile** (``TrainSite.profile``, ``allocator.train_profile``): when the site has a
step-time profile measured on its hardware, the compute term is ``padded_step_flops / (gpus x
effective_flops) + fixed_s``: the fitted per-device throughput replaces peak x MFU, and
``fixed_s`` (optimizer step and per-step overhead) is added once per step. The FLOPs are those
of what the measured learner computes: its micro-batches are right-padded to their longest
sequence (``allocator.padding``), so matmuls run on the workload's ``padded_tokens`` and the
attention on ``padded_attn_sq`` (1.6-2x the useful FLOPs on the count-down task's long-tailed
lengths); a profile is fitted on the same padded count. The roofline keeps the useful FLOPs
(MFU is defined on them, for a trainer that packs sequences; this learner's padding on the
codemath workloads is 1.003-1.02x). The communication terms are unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from allocator.memory import MemoryEstimate, ParallelConfig, training_memory
from services.generation.scheduling.hardware import Hardware
from services.generation.scheduling.models import ModelSpec

if TYPE_CHECKING:
    from allocator.padding import PaddedWork
    from allocator.train_profile import TrainProfile

MFU = 0.40  # useful model FLOPs / BF16 peak for Megatron-style dense training (see docstring)
TP_SIZES = (1, 2, 4, 8)
PP_SIZES = (1, 2, 4, 8, 16)
FWD_EQUIVALENTS = {"grpo": 5.0, "ppo": 10.0}  # forward-pass equivalents per token (see docstring)
TRAINED_MODELS = {"grpo": 1, "ppo": 2}  # PPO trains a critic of the same size beside the actor


@dataclass(frozen=True)
class TrainSite:
    """The GPUs training runs on: kind, node size and per-GPU inter-node bandwidth."""

    hw: Hardware
    gpus_per_node: int
    inter_node_gb_s: float  # GB/s per GPU (e.g. 8 x 200 Gbps RDMA per node of 8 = 25 GB/s)
    tflops: float | None = None  # overrides hw.bf16_tflops (kinds without a spec sheet, e.g. a CPU)
    profile: TrainProfile | None = None  # measured step time: replaces peak x MFU (module docstring)

    @property
    def peak_flops(self) -> float:
        return (self.tflops if self.tflops is not None else self.hw.bf16_tflops) * 1e12


@dataclass(frozen=True)
class TrainWorkload:
    tokens: float  # prompt + response tokens of the whole global batch
    attn_sq: float  # sum over sequences of (prompt + response)^2
    mb_tokens: int  # tokens per micro-batch (>= the longest sequence: one packed micro-batch)
    algorithm: str = "grpo"
    # what the learner computes: sum over its micro-batches of size x width (and x width^2),
    # allocator.padding; 0: unknown, the useful tokens (no padding)
    padded_tokens: float = 0.0
    padded_attn_sq: float = 0.0

    @classmethod
    def from_work(cls, work: PaddedWork, algorithm: str = "grpo") -> TrainWorkload:
        """The workload of a step whose (real or expected) micro-batches are ``work``."""
        return cls(tokens=work.tokens, attn_sq=work.attn_sq, mb_tokens=work.longest, algorithm=algorithm,
                   padded_tokens=work.padded_tokens, padded_attn_sq=work.padded_attn_sq)

    def padded(self) -> TrainWorkload:
        """The same step with the padded tokens as its tokens (what the learner's matmuls see)."""
        return replace(self, tokens=self.padded_tokens or self.tokens, attn_sq=self.padded_attn_sq or self.attn_sq)

    @property
    def fwd_equivalents(self) -> float:
        return FWD_EQUIVALENTS[self.algorithm]

    @property
    def trained_models(self) -> int:
        return TRAINED_MODELS[self.algorithm]


@dataclass(frozen=True)
class StepTime:
    cfg: ParallelConfig
    compute_s: float
    tp_comm_s: float
    pp_bubble_s: float
    pp_p2p_s: float
    dp_comm_s: float
    memory: MemoryEstimate
    fixed_s: float = 0.0  # measured profile: per-step overhead (optimizer step, launches), once per step

    @property
    def total_s(self) -> float:
        return self.compute_s + self.tp_comm_s + self.pp_bubble_s + self.pp_p2p_s + self.dp_comm_s + self.fixed_s


@dataclass(frozen=True)
class TrainSearch:
    """The fastest fitting config on y GPUs (``best``), or None with the closest miss."""

    gpus: int
    best: StepTime | None
    closest_miss: tuple[ParallelConfig, MemoryEstimate] | None

    def why_not(self, model: str, kind: str) -> str:
        if self.closest_miss is None:
            return f"{model} has no DP x TP x PP config on {self.gpus} x {kind}"
        cfg, mem = self.closest_miss
        return f"{model} does not fit on {self.gpus} x {kind}: best config {cfg.label()} {mem.describe()}"


def step_flops(model: ModelSpec, wl: TrainWorkload) -> float:
    """Useful FLOPs of one training step: ``fwd_eq x (2 N_matmul tokens + 2 h layers sum(L^2))``."""
    h = model.hidden
    matmul_params = model.params() - model.vocab * h * (0 if model.tied_embeddings else 1)
    return wl.fwd_equivalents * (2.0 * matmul_params * wl.tokens + 2.0 * h * model.layers * wl.attn_sq)


def padded_step_flops(model: ModelSpec, wl: TrainWorkload) -> float:
    """``step_flops`` of what the learner computes: its padded micro-batches (the useful FLOPs
    when the workload carries no padding)."""
    return step_flops(model, wl.padded())


def step_time(model: ModelSpec, cfg: ParallelConfig, site: TrainSite, wl: TrainWorkload) -> StepTime:
    """Predicted seconds of one training step of ``wl`` with ``cfg`` (see the module docstring)."""
    h, fe = model.hidden, wl.fwd_equivalents
    prof = site.profile
    if prof is None:
        compute, fixed = step_flops(model, wl) / (cfg.gpus * site.peak_flops * MFU), 0.0
    else:
        compute, fixed = padded_step_flops(model, wl) / (cfg.gpus * prof.effective_flops), prof.fixed_s
    replica_tokens = wl.tokens / cfg.dp
    nvlink = site.hw.nvlink_gb_s * 1e9
    net = site.inter_node_gb_s * 1e9
    tp_bytes = replica_tokens * h * 2.0 * 2.0 * (cfg.tp - 1) / cfg.tp
    tp_comm = fe * 2 * (model.layers / cfg.pp) * tp_bytes / nvlink if cfg.tp > 1 else 0.0
    m = max(1, math.ceil(replica_tokens / wl.mb_tokens))
    bubble = (compute + tp_comm) * (cfg.pp - 1) / m
    p2p_bw = net if cfg.tp * cfg.pp > site.gpus_per_node else nvlink
    p2p = fe * m * 2 * wl.mb_tokens * h * 2.0 / p2p_bw if cfg.pp > 1 else 0.0
    grad_bytes = 2.0 * model.params() / (cfg.tp * cfg.pp)
    dp_bw = net if cfg.gpus > site.gpus_per_node else nvlink
    dp_comm = wl.trained_models * 2.0 * (cfg.dp - 1) / cfg.dp * grad_bytes / dp_bw if cfg.dp > 1 else 0.0
    memory = training_memory(model, cfg, hbm_gb=site.hw.hbm_gb, mb_tokens=wl.mb_tokens,
                             trained_models=wl.trained_models)
    return StepTime(cfg, compute, tp_comm, bubble, p2p, dp_comm, memory, fixed)


def candidate_configs(model: ModelSpec, gpus: int, gpus_per_node: int) -> list[ParallelConfig]:
    out = []
    for tp in TP_SIZES:
        if tp > gpus_per_node or model.q_heads % tp or model.kv_heads % tp:
            continue
        for pp in PP_SIZES:
            if pp > model.layers or gpus % (tp * pp):
                continue
            out.append(ParallelConfig(dp=gpus // (tp * pp), tp=tp, pp=pp))
    return out


def search(model: ModelSpec, gpus: int, site: TrainSite, wl: TrainWorkload) -> TrainSearch:
    """The fastest DP x TP x PP config of ``gpus`` GPUs whose memory fits (see the docstring)."""
    if gpus < 1:
        raise ValueError(f"training needs at least 1 GPU, got {gpus}")
    best: StepTime | None = None
    miss: tuple[ParallelConfig, MemoryEstimate] | None = None
    for cfg in candidate_configs(model, gpus, site.gpus_per_node):
        st = step_time(model, cfg, site, wl)
        if not st.memory.fits:
            if miss is None or st.memory.needed < miss[1].needed:
                miss = (cfg, st.memory)
            continue
        if best is None or st.total_s < best.total_s:
            best = st
    return TrainSearch(gpus, best, miss)
