"""The trainer's part of the run configuration (``RunConfig.trainer``, ``services.common.config``):
pipeline mode, RL objective, batching, staleness bound, devices, data parallelism, backend."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, model_validator

from services.common.emulation_config import TrainerEmulationConfig
from services.common.lora_config import LoraConfig
from services.common.strict import StrictModel


class AlgorithmConfig(StrictModel):
    """The RL objective (``services.trainer.algorithms``): GRPO with DAPO options, or PPO with a critic."""

    name: Literal["grpo", "ppo"] = Field("grpo", description="Objective: grpo (group baseline) or ppo (critic + GAE).")
    advantage: Literal["grpo", "dr_grpo"] = Field("grpo", description="GRPO advantage estimator (ignored by ppo).")
    clip_high: float | None = Field(
        None, gt=0.0, le=10.0, description="Upper ratio clip (DAPO clip-higher, e.g. 0.28); None = trainer.clip_eps."
    )
    loss_agg: Literal["sample_mean", "token_mean"] = Field(
        "sample_mean", description="sample_mean (mean over tokens, then samples) or token_mean (DAPO token-level loss)."
    )
    dynamic_sampling: bool = Field(False, description="DAPO dynamic sampling: drop groups whose rewards are all equal.")
    off_policy: Literal["none", "tis", "decoupled"] = Field(
        "none",
        description="Correction for stale samples: none, tis (truncated importance sampling), "
        "decoupled (decoupled PPO against the proximal policy).",
    )
    is_cap: float = Field(
        2.0, ge=1.0, le=1000.0,
        description="Truncation of the behaviour importance weight (tis, decoupled).",
    )
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="PPO discount.")
    lam: float = Field(0.95, ge=0.0, le=1.0, description="PPO GAE lambda.")
    vf_coef: float = Field(0.5, gt=0.0, le=100.0, description="PPO value-loss coefficient.")
    value_clip: float = Field(0.2, gt=0.0, le=100.0, description="PPO value clip around the rollout-time values.")
    critic_lr: float = Field(1e-4, gt=0.0, le=1.0, description="PPO critic learning rate.")


class RepackConfig(StrictModel):
    """Dynamic repack in bounded mode (Laminar §5, ``services.rollout.repack_policy``): consolidate the
    long-tail trajectories of ramping-down instances onto a few, freeing the rest for new weights."""

    enabled: bool = Field(
        False,
        description="Migrate long tails between instances (needs an engine that can interrupt: vllm, hf).",
    )
    interval_s: float = Field(
        1.0, ge=0.05, le=600.0,
        description="Seconds between snapshots of the instances (KV use, running, queued).",
    )
    c_max: float = Field(0.99, gt=0.0, le=1.0, description="KV-cache fraction a destination may reach after the move.")
    batch_bound: int = Field(
        64, ge=2, le=100_000,
        description="Roofline batch bound B: samples an instance may decode after the move; "
        "a source has fewer running.",
    )


class CoordinationConfig(StrictModel):
    """How the orchestrator routes trajectories and synchronises instances (docs/staleness.md)."""

    policy: Literal["lazy", "staleflow"] = Field(
        "lazy",
        description="lazy: least-loaded pick, an instance takes new weights when idle (or, with partial rollout, "
        "when it can no longer start work); staleflow: StaleFlow's snapshot-command cycle (marginal-gain routing "
        "with withholding, interrupt-and-pull sync after a tentative update, migration).",
    )
    mu: float = Field(0.3, gt=0.0, le=1.0, description="staleflow: a route must gain mu x an idle instance's gain.")
    phi_wait: int = Field(3, ge=0, le=100_000, description="staleflow: queued samples before the excess migrates.")
    phi_throughput: float = Field(
        5.0, gt=1.0, le=1e6, description="staleflow: fastest / slowest modelled throughput that triggers a migration.",
    )
    migrate: bool = Field(
        False,
        description="staleflow: migrate (Alg. 5). Off by default: at 32 emulated H20 instances the throughput-gap "
        "rule fires at every step's tail and its re-prefills cost more than they win (docs/staleness.md).",
    )
    interval_s: float = Field(0.25, ge=0.01, le=600.0, description="staleflow: seconds between instance snapshots.")


class RecoveryConfig(StrictModel):
    """Trainer recovery (docs/recovery.md): recovery checkpoints and restarts of a dead trainer."""

    every: int = Field(
        10, ge=0, le=1_000_000,
        description="Write a recovery checkpoint (policy, optimizer, data cursor, experience and staleness state, "
        "metrics) every N versions (0 = off: a restarted trainer starts again from version 0).",
    )
    keep: int = Field(2, ge=1, le=1000, description="Recovery checkpoints kept (the newest; older ones are deleted).")
    max_restarts: int = Field(
        3, ge=0, le=1000,
        description="How often the launcher restarts a trainer that died (non-zero exit, killed by a signal) "
        "before the run fails; the SGS instances and relays stay up.",
    )


class TrainerConfig(StrictModel):
    """The trainer: pipeline mode, RL objective, dynamic batching, staleness bound, weight publication."""

    mode: Literal["sequential", "sync", "one_step", "bounded"] = Field(
        "one_step",
        description="Pipeline mode: sequential (baseline: generate all, then train), sync (on-policy, "
        "training starts on complete groups while generation runs), one_step (generation of k+1 overlaps "
        "training on k), "
        "bounded (trajectory-level asynchrony: instances run different versions, every trajectory within eta).",
    )
    eta: int = Field(
        1, ge=0, le=64,
        description="Staleness bound of bounded mode: V_traj + eta >= V_buf for every trained trajectory.",
    )
    partial_rollout: bool = Field(
        False,
        description="Interrupt in-flight trajectories when their instance takes a new version, "
        "re-prefill, continue (any mode).",
    )
    async_bound: int | None = Field(
        None, ge=0, le=64,
        description="RollArt's per-trajectory bound alpha: abort tracked trajectories older than n - alpha.",
    )
    redundancy_groups: int = Field(
        0, ge=0, le=100_000,
        description="Batch-level redundancy: extra groups per buffer (surplus aborted).",
    )
    redundancy_samples: int = Field(
        0, ge=0, le=1024,
        description="Group-level redundancy: extra samples per group (surplus aborted).",
    )
    max_inflight_groups: int = Field(
        0, ge=0, le=100_000,
        description="Groups in flight per SGS instance, every mode "
        "(0 = fill generation.max_inflight with whole groups).",
    )
    repack: RepackConfig = Field(default_factory=RepackConfig)
    coordination: CoordinationConfig = Field(default_factory=CoordinationConfig)
    checkpoint_every: int = Field(0, ge=0, le=1_000_000, description="Save the policy every N iterations (0 = never).")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    recovery: RecoveryConfig = Field(default_factory=RecoveryConfig)
    iterations: int = Field(40, ge=1, le=1_000_000, description="RL iterations (optimizer steps).")
    prompts_per_iteration: int = Field(32, ge=1, le=100_000, description="Prompts per iteration.")
    group_size: int = Field(8, ge=2, le=1024, description="Samples per prompt (GRPO group).")
    micro_batch_groups: int = Field(8, ge=1, le=100_000, description="Complete groups that trigger a forward/backward.")
    micro_batch_tokens: int = Field(
        4096, ge=16, le=4_194_304,
        description="Padded tokens per forward/backward pass (sequences are bucketed by length up to this; a longer "
        "sequence goes alone). Bounds activation memory; on a GPU each pass costs thousands of kernel launches "
        "whatever its size, so raise it there as far as memory allows (docs/gpu.md).",
    )
    skip_zero_advantage_groups: bool = Field(
        True,
        description="Skip the forward/backward of groups whose advantages are all zero when there is no KL term "
        "(they add no gradient; their samples still count in the normaliser). false: train them like any other "
        "group (same gradient, more compute; matches trainers that do not skip, e.g. TRL's GRPOTrainer).",
    )
    lr: float = Field(1e-4, gt=0.0, le=1.0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    clip_eps: float = Field(0.2, gt=0.0, le=10.0, description="PPO-style ratio clip.")
    kl_coef: float = Field(0.0, ge=0.0, le=10.0, description="KL-to-reference coefficient (0 = no reference model).")
    max_grad_norm: float = Field(1.0, gt=0.0, le=1e6, description="Gradient clipping norm.")
    chunk_bytes: int = Field(1 << 20, ge=1024, le=1 << 30, description="Weight stream chunk size.")
    threads: int = Field(1, ge=1, le=256, description="torch intra-op threads of the trainer process.")
    cpus: list[NonNegativeInt] = Field(
        default_factory=list,
        description="CPU ids the trainer process pins itself to "
        "(one-host emulation of a training site; empty = unpinned).",
    )
    seed: int = Field(0, ge=0, description="Trainer seed.")
    device: str = Field(
        "cpu", pattern=r"^(cpu|cuda(:[0-9]{1,2})?)$",
        description="Device the trainer trains on: cpu, cuda (the current CUDA device) or cuda:N.",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Compute precision of forward/backward: bfloat16 runs them under autocast while the "
        "parameters, gradients, optimizer state and pushed weights stay float32 (master weights).",
    )
    activation_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in backward "
        "(less memory; one more forward of each layer).",
    )
    ranks: int = Field(
        1, ge=1, le=64,
        description="Data-parallel trainer processes (FSDP2; gloo on CPU, NCCL on CUDA); rank 0 reads the stream.",
    )
    learner: Literal["auto", "process", "inline"] = Field(
        "auto",
        description="Where the learner runs: process (a child of the trainer process, apart from the rollout "
        "orchestrator: a killed learner is replaced and replays the steps since its last recovery checkpoint, "
        "losing no trajectory), inline (in the trainer process), auto (process with one rank on the CPU, "
        "inline otherwise: a child learner on a GPU is not verified yet).",
    )
    backend: Literal["torch", "megatron", "emulated"] = Field(
        "torch",
        description="What trains the policy (services.trainer.backends): torch (the Hugging Face model, FSDP2 when "
        "ranks > 1), megatron (a megatron-core GPTModel converted from it; weights pushed back under HF names) or "
        "emulated (EMULATED: no optimizer step, each step takes the allocator's predicted time: trainer.emulation).",
    )
    emulation: TrainerEmulationConfig | None = Field(
        None, description="The emulated learner's GPUs, model and parallel configuration (backend 'emulated' only; "
        "None there: one cpu-local core and the run's own model)."
    )
    lora: LoraConfig | None = Field(
        None,
        description="Train a LoRA adapter over the frozen base instead of every weight (torch backend): only the "
        "adapter is pushed to the SGS, which serves base + adapter; the KL reference is the base (adapter off). "
        "None = full fine-tuning.",
    )

    def learner_in_process(self) -> bool:
        """Whether the learner runs in a process of its own (``learner``, ``auto`` resolved); the
        emulated learner computes nothing and runs inline."""
        if self.backend == "emulated":
            return False
        if self.learner == "auto":
            return self.ranks == 1 and self.device == "cpu"
        return self.learner == "process"

    @model_validator(mode="after")
    def _parallel_supported(self) -> TrainerConfig:
        if self.ranks > 1 and self.algorithm.name == "ppo":
            raise ValueError("trainer.ranks > 1 trains grpo today: PPO's critic is not sharded yet")
        if self.ranks > 1 and self.learner == "process":
            raise ValueError("trainer.learner process needs trainer.ranks 1: the data-parallel ranks are the "
                             "launcher's processes, led by rank 0 through their process group")
        if self.backend != "emulated" and self.emulation is not None:
            raise ValueError(f"trainer.emulation is read only by trainer.backend 'emulated', not {self.backend!r}")
        if self.backend == "emulated" and (self.ranks > 1 or self.lora is not None or self.learner == "process"):
            raise ValueError("trainer.backend emulated models its GPUs (trainer.emulation.gpus): it runs inline, one "
                             "rank, no LoRA")
        if self.ranks > 1 and self.backend == "megatron":
            raise ValueError("trainer.backend megatron trains one rank today (its data parallelism is not wired up)")
        if self.lora is not None and self.backend == "megatron":
            raise ValueError("trainer.lora trains with trainer.backend torch: LoRA on megatron-core is not implemented "
                             "(drop trainer.lora, or set trainer.backend torch)")
        return self

    @model_validator(mode="after")
    def _groups_fit(self) -> TrainerConfig:
        if self.micro_batch_groups > self.prompts_per_iteration:
            raise ValueError(
                f"micro_batch_groups ({self.micro_batch_groups}) must be <= "
                f"prompts_per_iteration ({self.prompts_per_iteration})"
            )
        return self
