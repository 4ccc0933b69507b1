"""Plain dataclasses that cross component boundaries (protobuf stays at the RPC edge)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PromptSpec:
    prompt_id: str
    token_ids: tuple[int, ...]
    group_id: str = ""
    estimated_length: float = 0.0  # estimated output tokens (0 = unknown); LPT admission and dispatch
    forced_length: int = 0  # forced-length replay: exactly this many tokens, EOS ignored (0 = off)
    task: str = ""  # task tag (environment kind); the router sends it to its pool (generation.affinity); "" = untagged
    forced_lengths: tuple[int, ...] = ()  # forced-length replay per sample (one per sample), instead of forced_length

    @property
    def group(self) -> str:
        return self.group_id or self.prompt_id

    def forced_for(self, sample_index: int) -> int:
        """The forced length of sample ``sample_index`` (0 = the policy decides)."""
        return self.forced_lengths[sample_index] if self.forced_lengths else self.forced_length


SEED_LIMIT = 1 << 64  # a sampling seed is an unsigned 64-bit integer (the wire's uint64; torch's manual_seed range)


@dataclass(frozen=True)
class GenerateParams:
    samples_per_prompt: int = 1
    max_new_tokens: int = 0  # 0 = the service default
    min_weight_version: int = 0
    tag: str = ""
    interruptible: bool = False  # partial rollout: return running samples early on a weight update
    temperature: float = 0.0  # per-request sampling; 0 = the service default
    top_p: float = 0.0  # 0 = off
    top_k: int = 0  # 0 = off
    # seeded sampling (evaluations): each sample draws from its own generator, seeded from this and the
    # sample's prompt id and index, so a rerun reproduces it; None = the engine's generator (training)
    seed: int | None = None


@dataclass(frozen=True)
class SampleRecord:
    """One finished sample, as streamed by the SGS."""

    prompt_id: str
    group_id: str
    sample_index: int
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    weight_version: int
    finish_reason: str
    submitted_at: float
    started_at: float
    finished_at: float
    # trained tokens among ``token_ids`` (1) and context tokens the loss skips (0): a multi-turn
    # trajectory's environment observations (services.agentic.training); empty = every token
    loss_mask: tuple[int, ...] = ()

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask) if self.loss_mask else len(self.token_ids)


@dataclass(frozen=True)
class HealthSnapshot:
    status: str
    weight_version: int
    pending_version: int
    running: int
    waiting: int
    finished: int
    kv_usage: float
    engine: str
    generated_tokens: int
