"""Configuration of agentic multi-turn rollouts (``services/agentic``, RollArt §5.3; docs/agentic.md).

Off by default. With ``enabled: true`` a run trains on multi-turn trajectories of ``env``: the
launcher starts ``workers`` environment worker processes, the trainer drives one EnvManager per
trajectory (``services.rollout.agentic``) and evaluates on held-out episodes. The environment
worker (``python -m services.agentic``) and the rollout runners read this section either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from services.common.strict import StrictModel
from services.common.task_config import CountdownDistribution

if TYPE_CHECKING:
    from services.common.config import RunConfig


class LatencyConfig(StrictModel):
    """Injected per-step environment latency (benchmarks; RollArt §8 used mean 10 s, σ 1..10 s)."""

    kind: Literal["none", "fixed", "normal"] = Field(
        "none",
        description="none: no delay; fixed: mean_s every step; normal: N(mean_s, std_s) truncated at 0 (resampled).",
    )
    mean_s: float = Field(0.0, ge=0.0, le=3600.0, description="Fixed delay, or the normal's mean (s).")
    std_s: float = Field(0.0, ge=0.0, le=3600.0, description="Standard deviation of the normal before truncation (s).")
    seed: int = Field(
        0, ge=0,
        description="Seed of the sampler (each session draws from its own stream, fixed by this and the episode seed).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> LatencyConfig:
        if self.kind == "normal" and self.mean_s == 0.0 and self.std_s == 0.0:
            raise ValueError("latency.kind 'normal' needs mean_s > 0 or std_s > 0 (use kind 'none' for no delay)")
        if self.kind != "normal" and self.std_s:
            raise ValueError(f"latency.std_s ({self.std_s}) applies only to kind 'normal', not {self.kind!r}")
        return self


class CalculatorEnvConfig(CountdownDistribution):
    """The tool task: a count-down problem (``services.tasks.arith``) solved through a calculator."""

    max_steps: int = Field(6, ge=1, le=200, description="Most subtractions a problem needs.")
    invalid_action: Literal["continue", "end"] = Field(
        "continue",
        description="A turn that does not parse: continue (observation '=,', the turn is spent) or end the episode "
        "with reward 0.",
    )


class WalkEnvConfig(StrictModel):
    """The stateful text game: walk along a line of cells to a target, a few moves per turn."""

    size: int = Field(10, ge=2, le=1000, description="Cells 0..size-1; moves into a wall are spent in place.")
    max_moves_per_turn: int = Field(3, ge=1, le=64, description="Most moves one action may hold.")
    invalid_action: Literal["continue", "end"] = Field(
        "continue",
        description="A turn that does not parse: continue (the position is observed again) or end with reward 0.",
    )


class AgenticConfig(StrictModel):
    """Agentic multi-turn rollouts: environment workers and one EnvManager per trajectory."""

    enabled: bool = Field(
        False,
        description="Train on multi-turn trajectories of env (GRPO groups of trainer.group_size trajectories of one "
        "episode).",
    )
    interaction: Literal["trajectory", "batch"] = Field(
        "trajectory",
        description="trajectory: each trajectory steps its environment as soon as its turn is generated (RollArt); "
        "batch: the baseline, every trajectory of a wave generates turn k, then every environment steps, then turn "
        "k+1.",
    )
    redundant_trajectories: int = Field(
        0, ge=0, le=64,
        description="Extra trajectories launched per GRPO group (redundant environment rollouts): the first "
        "group_size to finish are kept, the rest aborted and counted.",
    )
    max_replacements: int = Field(
        4, ge=0, le=1000,
        description="Trajectories of one group lost to environment or reward failures that are replaced by "
        "a new one on the same episode; one more loss aborts the group (counted).",
    )
    log_trajectories: bool = Field(
        True, description="Write every trained trajectory (tokens, mask, turns, reward) to trajectories.jsonl."
    )
    env: str = Field(
        "calculator",
        description="Environment kind of the rollouts (services.agentic.ENVIRONMENTS; checked when a run is prepared).",
    )
    workers: int = Field(
        1, ge=1, le=256, description="Environment worker processes; trajectories go to them round robin."
    )
    worker_threads: int = Field(
        64, ge=1, le=4096, description="Steps one worker runs at once (each holds a thread for its latency and step)."
    )
    max_sessions: int = Field(
        4096, ge=1, le=1_000_000, description="Open sessions one worker holds; a Reset beyond is RESOURCE_EXHAUSTED."
    )
    session_ttl_s: float = Field(
        600.0, gt=0.0, le=86400.0, description="A session idle this long is closed by its worker (s)."
    )
    max_turns: int = Field(8, ge=1, le=1024, description="Turns (generate + step) of one trajectory at most.")
    max_new_tokens_per_turn: int = Field(16, ge=1, le=65536, description="Generated tokens of one turn at most.")
    max_context_tokens: int = Field(
        384, ge=2, le=1_000_000,
        description="Tokens of a trajectory's running context at most; a turn that would pass it ends the trajectory.",
    )
    step_timeout_s: float = Field(
        30.0, gt=0.0, le=3600.0, description="A step (latency included) slower than this fails (s)."
    )
    step_retries: int = Field(
        2, ge=0, le=100,
        description="Retries of a failed step (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED) before the trajectory is "
        "dropped.",
    )
    retry_backoff_s: float = Field(
        0.1, ge=0.0, le=60.0, description="Wait before the first retry, doubled each time (s)."
    )
    concurrency: int = Field(64, ge=1, le=65536, description="Trajectories the trajectory-level runner drives at once.")
    agent: str | None = Field(
        None,
        description="module:function of an agent that plays each episode through Braid's OpenAI-compatible gateway "
        "(services.gateway; docs/gateway.md) instead of the EnvManager: it gets a base URL, a session key, the task, "
        "seed and first observation, and returns the episode's reward. Needs a model whose tokenizer has a chat "
        "template.",
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
    )
    agent_model: str = Field(
        "braid-policy", min_length=1, max_length=128, description="The model name the gateway serves to the agent."
    )
    gateway_host: str = Field("127.0.0.1", min_length=1, description="Address the gateway listens on (a free port).")
    latency: LatencyConfig = Field(default_factory=LatencyConfig)
    calculator: CalculatorEnvConfig = Field(default_factory=CalculatorEnvConfig)
    walk: WalkEnvConfig = Field(default_factory=WalkEnvConfig)

    @model_validator(mode="after")
    def _consistent(self) -> AgenticConfig:
        if self.agent is not None and self.interaction != "trajectory":
            raise ValueError(
                "agentic.agent plays whole episodes on its own: it needs interaction 'trajectory', not 'batch'"
            )
        if self.max_new_tokens_per_turn >= self.max_context_tokens:
            raise ValueError(
                f"max_new_tokens_per_turn ({self.max_new_tokens_per_turn}) must be < max_context_tokens "
                f"({self.max_context_tokens})"
            )
        return self


def check_agentic_run(run: RunConfig) -> None:
    """What an agentic run (``services.rollout.agentic``) supports; the rest is refused by name
    (``RunConfig``'s validator)."""
    if not run.agentic.enabled:
        return
    tc, a = run.trainer, run.agentic
    unsupported = {
        "trainer.algorithm.name 'ppo'": tc.algorithm.name == "ppo",  # GAE assumes one contiguous completion
        "trainer.partial_rollout": tc.partial_rollout,
        "trainer.repack.enabled": tc.repack.enabled,
        "trainer.redundancy_samples (use agentic.redundant_trajectories)": tc.redundancy_samples > 0,
        "trainer.ranks > 1": tc.ranks > 1,
        "forced_length_ramp / forced_length_replay": bool(
            run.forced_length_ramp.start or run.forced_length_replay.file
        ),
        "task.kind 'dataset' (the environment's episodes are the task)": run.task.kind == "dataset",
    }
    refused = [name for name, on in unsupported.items() if on]
    if refused:
        raise ValueError(f"agentic.enabled does not support {', '.join(refused)} (docs/agentic.md)")
    if a.concurrency < tc.group_size + a.redundant_trajectories:
        raise ValueError(f"agentic.concurrency ({a.concurrency}) must hold one group's trajectories: "
                         "trainer.group_size + agentic.redundant_trajectories = "
                         f"{tc.group_size + a.redundant_trajectories}")
    g = run.generation
    positions = run.model.max_positions if run.model.path is None else 10**9  # a checkpoint's: the SGS refuses longer
    problem = context_problem(a, max_prompt_tokens=g.max_prompt_tokens, max_new_tokens=g.max_new_tokens,
                              max_positions=positions)
    if problem is not None:
        raise ValueError(problem)


def context_problem(a: AgenticConfig, *, max_prompt_tokens: int, max_new_tokens: int, max_positions: int) -> str | None:
    """Why trajectories under ``a``'s turn and context limits cannot be served by an SGS with these
    limits, or None: every turn's prompt is the running context (at most ``max_context_tokens -
    max_new_tokens_per_turn`` tokens) and it generates at most ``max_new_tokens_per_turn``."""
    if a.max_new_tokens_per_turn > max_new_tokens:
        return (f"agentic.max_new_tokens_per_turn ({a.max_new_tokens_per_turn}) exceeds generation.max_new_tokens "
                f"({max_new_tokens})")
    if a.max_context_tokens - a.max_new_tokens_per_turn > max_prompt_tokens:
        return ("agentic.max_context_tokens - max_new_tokens_per_turn "
                f"({a.max_context_tokens - a.max_new_tokens_per_turn}) "
                f"exceeds generation.max_prompt_tokens ({max_prompt_tokens})")
    if a.max_context_tokens > max_positions:
        return f"agentic.max_context_tokens ({a.max_context_tokens}) exceeds the model's {max_positions} positions"
    return None
