"""Training memory model: bytes per GPU of one (DP, TP, PP) configuration of the trainer.

What one GPU holds, for a model of N parameters split over TP x PP GPUs and DP replicas:

- **Model states under ZeRO stage 1** (Megatron-LM's distributed optimizer, the trainer
  backends' setting): bf16 weights (2 B/param) and fp32 main gradients (4 B/param) for the
  GPU's TP x PP shard; fp32 master weights and Adam's two moments (12 B/param) additionally
  sharded over DP. That is ``N / (tp pp) x (6 + 12 / dp)`` bytes per trained model (PPO trains
  a critic of the same size beside the actor: ``trained_models = 2``), plus bf16 weights of the
  frozen reference model (``N / (tp pp) x 2``).
- **Activations with full recomputation** (Megatron ``--recompute-granularity full``, the only
  setting that fits 20K-token sequences): every layer's bf16 input is kept (2 h bytes per token,
  split over TP by sequence parallelism); under the 1F1B schedule the first stage holds ``pp``
  micro-batches of its ``layers / pp`` layers, i.e. ``layers x mb_tokens x 2 h / tp`` bytes.
  While recomputing one layer its full activations live once: Korthikanti et al. (2022), Eq. 2
  without the attention-score term (FlashAttention keeps no s x s matrix): ``34 h`` bytes per
  token, split over TP.
- **Logits**: the loss is computed over chunks of ``LOGITS_CHUNK_TOKENS`` tokens (chunked
  cross-entropy), fp32 logits and their gradient: ``chunk x vocab x 8 / tp`` bytes.

Usable memory is ``HBM x USABLE_FRACTION`` (CUDA context, NCCL buffers, allocator
fragmentation take the rest). ``check_fit`` returns needed vs available GB per GPU, so a
config that does not fit is rejected with both numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.generation.scheduling.models import ModelSpec

USABLE_FRACTION = 0.9  # of HBM, after CUDA context / NCCL buffers / fragmentation
LOGITS_CHUNK_TOKENS = 4096  # chunked cross-entropy: fp32 logits for this many tokens at once
MODEL_STATE_BYTES = 6.0  # bf16 weights (2) + fp32 main grads (4) per param of the TP x PP shard
OPTIMIZER_BYTES = 12.0  # fp32 master weights + Adam m + v per param, sharded over DP (ZeRO-1)
LAYER_WORKING_BYTES = 34.0  # x hidden per token: one layer's activations while it is recomputed


@dataclass(frozen=True)
class ParallelConfig:
    dp: int
    tp: int
    pp: int

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    def label(self) -> str:
        return f"DP{self.dp}xTP{self.tp}xPP{self.pp}"


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU, by part, and whether it fits."""

    model_states: float
    optimizer: float
    reference: float
    activations: float
    logits: float
    available: float

    @property
    def needed(self) -> float:
        return self.model_states + self.optimizer + self.reference + self.activations + self.logits

    @property
    def fits(self) -> bool:
        return self.needed <= self.available

    def describe(self) -> str:
        return (f"needs {self.needed / 1e9:.1f} GB per GPU (states {self.model_states / 1e9:.1f}, optimizer "
                f"{self.optimizer / 1e9:.1f}, reference {self.reference / 1e9:.1f}, activations "
                f"{self.activations / 1e9:.1f}, logits {self.logits / 1e9:.1f}), {self.available / 1e9:.1f} GB "
                "available")


def training_memory(
    model: ModelSpec, cfg: ParallelConfig, *, hbm_gb: float, mb_tokens: int,
    trained_models: int = 1, reference: bool = True,
) -> MemoryEstimate:
    """Per-GPU memory of training ``model`` with ``cfg`` on micro-batches of ``mb_tokens`` tokens."""
    shard = model.params() / (cfg.tp * cfg.pp)
    h = model.hidden
    checkpoints = model.layers * mb_tokens * 2.0 * h / cfg.tp
    working = LAYER_WORKING_BYTES * h * mb_tokens / cfg.tp
    chunk = min(mb_tokens, LOGITS_CHUNK_TOKENS)
    return MemoryEstimate(
        model_states=trained_models * shard * MODEL_STATE_BYTES,
        optimizer=trained_models * shard * OPTIMIZER_BYTES / cfg.dp,
        reference=shard * 2.0 if reference else 0.0,
        activations=checkpoints + working,
        logits=chunk * model.vocab * 8.0 / cfg.tp,
        available=hbm_gb * 1e9 * USABLE_FRACTION,
    )
