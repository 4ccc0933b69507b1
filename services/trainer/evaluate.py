"""Scoring of evaluation samples against the verifier (pure)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from services.common.types import SampleRecord
from services.policy.model import Policy
from services.tasks.arith import Problem, reward

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

    def to_json(self) -> dict:
        return asdict(self)


def bucket_name(lo: int, hi: int) -> str:
    return f"{lo}" if lo == hi else (f"{lo}+" if hi >= 10**9 else f"{lo}-{hi}")


def summarize(outcomes: list[tuple[int, float]], version: int, response_len_mean: float) -> EvalResult:
    """``outcomes``: (difficulty, reward 0/1) per held-out item -> accuracy, its binomial standard
    error and the breakdown by difficulty."""
    n = len(outcomes)
    acc = sum(r for _, r in outcomes) / n
    breakdown = {}
    for lo, hi in BUCKETS:
        rs = [r for d, r in outcomes if lo <= d <= hi]
        if rs:
            breakdown[bucket_name(lo, hi)] = {"n": len(rs), "accuracy": sum(rs) / len(rs)}
    return EvalResult(weight_version=version, prompts=n, accuracy=acc, stderr=math.sqrt(acc * (1 - acc) / n),
                      response_len_mean=response_len_mean, by_difficulty=breakdown)


def score(problems: list[Problem], samples: list[SampleRecord], policy: Policy, version: int) -> EvalResult:
    """Accuracy (one sample per prompt), its binomial standard error, and a difficulty breakdown."""
    by_id = {p.prompt_id: p for p in problems}
    if sorted(s.prompt_id for s in samples) != sorted(by_id):
        raise ValueError("evaluation samples do not match the evaluation prompts one to one")
    outcomes = [(by_id[s.prompt_id].difficulty, reward(by_id[s.prompt_id], policy.decode(list(s.token_ids)))) for s in samples]
    return summarize(outcomes, version, sum(len(s.token_ids) for s in samples) / len(samples))
