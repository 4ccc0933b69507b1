"""Configuration of the reward service (``services/reward``, docs/reward.md).

Stateless reward workers in their own process pool (RollArt's serverless reward): each worker
scores finished trajectories with one reward kind (``rule`` or ``model``); a client pool spreads
calls over the workers with retries; a controller (``flows/reward_pool.py``) starts the workers
and, with ``scaling.enabled``, adds and removes workers as their utilisation moves.
"""

from __future__ import annotations

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
    window_s: float = Field(10.0, gt=0.0, le=3600.0, description="Seconds of load observed at the current size before a decision.")
    cooldown_s: float = Field(10.0, ge=0.0, le=3600.0, description="Seconds after a change (a worker joined or left) whose load is not counted.")

    @model_validator(mode="after")
    def _consistent(self) -> RewardScalingConfig:
        if self.min_workers > self.max_workers:
            raise ValueError(f"scaling.min_workers ({self.min_workers}) must be <= scaling.max_workers ({self.max_workers})")
        if self.low_utilisation >= self.high_utilisation:
            raise ValueError(
                f"scaling.low_utilisation ({self.low_utilisation}) must be < scaling.high_utilisation ({self.high_utilisation})"
            )
        return self


class RewardConfig(StrictModel):
    """The reward service: reward kind, worker processes, client retries and pool scaling."""

    kind: str = Field("rule", description="Reward kind (services.reward.registry.REWARD_KINDS): rule (replay, exact) or model (a learned classifier).")
    model_path: str | None = Field(
        None, description="Local directory of the classifier `braid reward train` wrote (kind 'model'; never downloaded)."
    )
    workers: int = Field(1, ge=1, le=256, description="Reward worker processes started with the run.")
    threads: int = Field(8, ge=1, le=1024, description="Requests one worker scores at once (each holds a thread for its latency and scoring).")
    timeout_s: float = Field(30.0, gt=0.0, le=3600.0, description="A score slower than this on the worker (queueing included) is DEADLINE_EXCEEDED (s).")
    retries: int = Field(3, ge=0, le=100, description="Client retries of a failed score (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED), each on another worker.")
    retry_backoff_s: float = Field(0.05, ge=0.0, le=60.0, description="Wait before the first retry, doubled each time (s).")
    max_queue: int = Field(256, ge=0, le=10_000, description="Requests one worker holds waiting for a thread; beyond, Score is RESOURCE_EXHAUSTED.")
    latency: LatencyConfig = Field(default_factory=LatencyConfig)
    scaling: RewardScalingConfig = Field(default_factory=RewardScalingConfig)

    @model_validator(mode="after")
    def _consistent(self) -> RewardConfig:
        from services.reward.registry import REWARD_KINDS

        REWARD_KINDS[self.kind]  # raises naming the registered kinds
        if self.kind == "model" and not self.model_path:
            raise ValueError("reward.kind 'model' needs reward.model_path (a directory written by `braid reward train`)")
        sc = self.scaling
        if sc.enabled and not sc.min_workers <= self.workers <= sc.max_workers:
            raise ValueError(
                f"reward.workers ({self.workers}) must lie in [scaling.min_workers, scaling.max_workers] = "
                f"[{sc.min_workers}, {sc.max_workers}]"
            )
        return self
