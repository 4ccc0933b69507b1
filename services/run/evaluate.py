"""Scoring of evaluation samples against the verifier (pure)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from services.common.types import SampleRecord
from services.rollout.rewards import Outcome
from services.tasks.source import TaskItem

# difficulty buckets (scratchpad steps) for the per-difficulty breakdown
BUCKETS = ((1, 1), (2, 3), (4, 7), (8, 15), (16, 10**9))


@dataclass(frozen=True)
class EvalResult:
    weight_version: int
    prompts: int
    accuracy: float
    stderr: float
    response_len_mean: float
    by_difficulty: dict[str, dict[str, float]]
    reward_failures: int = 0  # samples whose reward failed (counted incorrect; services.rollout.rewards)

    def to_json(self) -> dict:
        return asdict(self)


def bucket_name(lo: int, hi: int) -> str:
    return f"{lo}" if lo == hi else (f"{lo}+" if hi >= 10**9 else f"{lo}-{hi}")


def summarize(outcomes: list[tuple[int | str, float]], version: int, response_len_mean: float) -> EvalResult:
    """``outcomes``: (difficulty or group name, reward 0/1) per held-out item -> accuracy, its binomial
    standard error and the breakdown by difficulty bucket (ints) or by group (strings)."""
    n = len(outcomes)
    acc = sum(r for _, r in outcomes) / n
    breakdown = {}
    for lo, hi in BUCKETS:
        rs = [r for d, r in outcomes if isinstance(d, int) and lo <= d <= hi]
        if rs:
            breakdown[bucket_name(lo, hi)] = {"n": len(rs), "accuracy": sum(rs) / len(rs)}
    for group in sorted({d for d, _ in outcomes if isinstance(d, str)}):
        rs = [r for d, r in outcomes if d == group]
        breakdown[group] = {"n": len(rs), "accuracy": sum(rs) / len(rs)}
    return EvalResult(weight_version=version, prompts=n, accuracy=acc, stderr=math.sqrt(acc * (1 - acc) / n),
                      response_len_mean=response_len_mean, by_difficulty=breakdown)


def score(items: list[TaskItem], samples: list[SampleRecord], outcomes: list[Outcome], version: int) -> EvalResult:
    """Accuracy (one sample per prompt, ``outcomes[i]`` the reward service's verdict on
    ``samples[i]``), its binomial standard error, and a difficulty breakdown."""
    by_id = {p.prompt_id: p for p in items}
    if sorted(s.prompt_id for s in samples) != sorted(by_id) or len(outcomes) != len(samples):
        raise ValueError("evaluation samples do not match the evaluation prompts one to one")
    graded = [(by_id[s.prompt_id].group or by_id[s.prompt_id].difficulty, float(o.correct))
              for s, o in zip(samples, outcomes, strict=True)]
    result = summarize(graded, version, sum(len(s.token_ids) for s in samples) / len(samples))
    return replace(result, reward_failures=sum(1 for o in outcomes if o.failure))
