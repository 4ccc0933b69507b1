"""Configuration of the reward service (``services/reward``, docs/reward.md).

Stateless reward workers in their own process pool (RollArt's serverless reward): each worker
scores finished trajectories with one reward kind (``rule`` or ``model``); a client pool spreads
calls over the workers with retries; a controller (``flows/reward_pool.py``) starts the workers
and, with ``scaling.enabled``, adds and removes workers as their utilisation moves.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from services.common.agentic_config import LatencyConfig
from services.common.strict import StrictModel


class RewardScalingConfig(StrictModel):
    """Elastic scaling of the reward pool (``services/reward/scaling.py`` explains the rule)."""

    enabled: bool = Field(False, description="Add and remove reward workers at run time as their utilisation moves.")
    min_workers: int = Field(1, ge=1, le=256, description="Never scale in below this many workers.")
    max_workers: int = Field(4, ge=1, le=256, description="Never scale out beyond this many workers.")
    high_utilisation: float = Field(
        0.75, gt=0.0, le=1.0,
        description="Scale out when the pool's busy fraction of its scoring threads over the window reaches this "
        "(or requests waited for a thread throughout the window).",
    )
    low_utilisation: float = Field(
        0.25, ge=0.0, lt=1.0,
        description="Scale in when the busy fraction over the window is at most this, nothing waited, and one "
        "fewer worker would stay below high_utilisation.",
    )
    window_s: float = Field(
        10.0, gt=0.0, le=3600.0, description="Seconds of load observed at the current size before a decision."
    )
    cooldown_s: float = Field(
        10.0, ge=0.0, le=3600.0,
        description="Seconds after a change (a worker joined or left) whose load is not counted.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> RewardScalingConfig:
        if self.min_workers > self.max_workers:
            raise ValueError(
                f"scaling.min_workers ({self.min_workers}) must be <= scaling.max_workers ({self.max_workers})"
            )
        if self.low_utilisation >= self.high_utilisation:
            raise ValueError(
                f"scaling.low_utilisation ({self.low_utilisation}) must be < scaling.high_utilisation "
                f"({self.high_utilisation})"
            )
        return self


BUILTIN_TERMS = ("exact", "numeric", "format")


class RewardTermConfig(StrictModel):
    """One term of a dataset task's reward (``services.reward.dataset``); a sample's reward is the sum of
    ``weight x term`` over the terms."""

    fn: str = Field(
        ..., min_length=1, max_length=512,
        description="exact (the completion equals the reference, whitespace and case folded), numeric (the "
        "completion's number equals the reference's; see extract), format (the completion matches pattern), or "
        "your own function as 'module:function' (docs/reward.md: signature and return value).",
    )
    weight: float = Field(1.0, ge=-1000.0, le=1000.0, description="Multiplies the term's value.")
    extract: Literal["auto", "last", "gsm8k", "boxed"] = Field(
        "auto",
        description="numeric: which number counts, in the completion and in the reference: last (the last number), "
        "gsm8k (after '#### '), boxed (inside \\boxed{}), auto (boxed, else gsm8k, else last).",
    )
    pattern: str | None = Field(
        None, max_length=4096,
        description="format: a regular expression the completion must contain (re.search, DOTALL).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> RewardTermConfig:
        import re

        custom = ":" in self.fn
        if not custom and self.fn not in BUILTIN_TERMS:
            raise ValueError(f"fn {self.fn!r} is neither a built-in term {list(BUILTIN_TERMS)} nor 'module:function'")
        if custom:
            module, _, attr = self.fn.partition(":")
            if not (module and attr and all(p.isidentifier() for p in module.split(".")) and attr.isidentifier()):
                raise ValueError(
                    f"fn {self.fn!r} is not 'module:function' (a dotted module path, then a function name)"
                )
        if (self.fn == "format") != (self.pattern is not None):
            raise ValueError("pattern belongs to fn 'format' (and 'format' needs one)" if self.pattern is not None
                             else "fn 'format' needs a pattern")
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as err:
                raise ValueError(f"pattern {self.pattern[:80]!r} is not a regular expression: {err}") from None
        return self


def _default_terms() -> list[RewardTermConfig]:
    return [RewardTermConfig(fn="numeric")]


class RewardConfig(StrictModel):
    """The reward service: reward kind, worker processes, client retries and pool scaling."""

    kind: str = Field(
        "rule",
        description="Reward kind (services.reward.registry.REWARD_KINDS; checked when a run is prepared): rule "
        "(replay, exact), model (a learned classifier) or emulated (EMULATED runs: correct with probability rate).",
    )
    rate: float = Field(
        0.5, ge=0.0, le=1.0,
        description="kind emulated: the probability that a sample is correct (reward 1; else 0), drawn from a hash "
        "of the sample (services.reward.emulated). Emulation measures time, never learning.",
    )
    model_path: str | None = Field(
        None,
        description="Local directory of the classifier `braid reward train` wrote (kind 'model'; never downloaded).",
    )
    workers: int = Field(1, ge=1, le=256, description="Reward worker processes started with the run.")
    threads: int = Field(
        8, ge=1, le=1024,
        description="Requests one worker scores at once (each holds a thread for its latency and scoring).",
    )
    timeout_s: float = Field(
        30.0, gt=0.0, le=3600.0,
        description="A score slower than this on the worker (queueing included) is DEADLINE_EXCEEDED (s).",
    )
    retries: int = Field(
        3, ge=0, le=100,
        description="Client retries of a failed score (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED), each on "
        "another worker.",
    )
    retry_backoff_s: float = Field(
        0.05, ge=0.0, le=60.0, description="Wait before the first retry, doubled each time (s)."
    )
    max_queue: int = Field(
        256, ge=0, le=10_000,
        description="Requests one worker holds waiting for a thread; beyond, Score is RESOURCE_EXHAUSTED.",
    )
    terms: list[RewardTermConfig] = Field(
        default_factory=_default_terms, min_length=1, max_length=16,
        description="Dataset tasks (task.kind 'dataset'): the reward is the sum of weight x term. A sample is "
        "correct (accuracy) when every term that judges correctness says so (exact, numeric, and a function "
        "returning 'correct'); with none, when its reward is >= 1.",
    )
    python_path: list[str] = Field(
        default_factory=list, max_length=64,
        description="Directories put first on a reward worker's import path, where your 'module:function' terms live "
        "(the directory braid runs in is always there).",
    )
    shuffle_fraction: float = Field(
        0.0, ge=0.0, le=1.0,
        description="A sanity control: this share of the training groups (picked by a hash of shuffle_seed and the "
        "group's prompt id) is trained on its rewards permuted within the group, so they say nothing about which "
        "sample was good (services/rollout/reward_shuffle.py). 0 = off; evaluations are never shuffled.",
    )
    shuffle_seed: int = Field(0, ge=0, description="Seed of shuffle_fraction's choice of groups and permutations.")
    latency: LatencyConfig = Field(default_factory=LatencyConfig)
    scaling: RewardScalingConfig = Field(default_factory=RewardScalingConfig)

    @model_validator(mode="after")
    def _consistent(self) -> RewardConfig:
        if self.kind == "model" and not self.model_path:
            raise ValueError(
                "reward.kind 'model' needs reward.model_path (a directory written by `braid reward train`)"
            )
        sc = self.scaling
        if sc.enabled and not sc.min_workers <= self.workers <= sc.max_workers:
            raise ValueError(
                f"reward.workers ({self.workers}) must lie in [scaling.min_workers, scaling.max_workers] = "
                f"[{sc.min_workers}, {sc.max_workers}]"
            )
        return self
