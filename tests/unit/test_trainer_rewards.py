"""The trainer's side of the reward service: futures of outcomes, failures counted and logged, never raised."""

from __future__ import annotations

import json
import threading

import pytest

from services.common.types import SampleRecord
from services.reward.client import RewardError
from services.reward.protocol import RewardResult
from services.rollout.rewards import FAILURES, Outcome, ServiceRewards, failures_logged, outcome_of
from services.tasks.arith import Problem


class Pool:
    """Scores 'ok' completions 1.0, raises INTERNAL for 'boom', records every request."""

    def __init__(self):
        self.requests, self.lock, self.closed = [], threading.Lock(), False

    def score(self, request):
        with self.lock:
            self.requests.append(request)
        if request.actions[0] == "boom":
            raise RewardError("INTERNAL", "reward kind 'rule' failed: ValueError: boom")
        return RewardResult(1.0 if request.actions[0] == "ok" else 0.5, "rule", {}, "w", 0.0)

    def close(self):
        self.closed = True


def _sample(i: int) -> SampleRecord:
    return SampleRecord("p0", "p0", i, (1, 2), (3,), (-0.5,), 4, "stop", 0.0, 0.0, 0.0)


def test_outcomes_come_back_as_futures_and_failures_are_counted_not_raised(tmp_path):
    pool = Pool()
    rewards = ServiceRewards(pool, tmp_path, threads=2)
    problem = Problem("p0", 247, 9, 200)
    futures = [rewards.submit(problem, _sample(i), text) for i, text in enumerate(["ok", "boom", "half"])]
    assert [f.result() for f in futures] == [Outcome(1.0, True), Outcome(0.0, False, "INTERNAL: reward kind 'rule' "
                                                                       "failed: ValueError: boom"), Outcome(0.5, False)]
    assert sorted(r.request_id for r in pool.requests) == ["p0/0", "p0/1", "p0/2"]
    assert all(r.task == "arith" and r.prompt == "247-9>200=" for r in pool.requests)
    rows = [json.loads(x) for x in (tmp_path / FAILURES).read_text().splitlines()]
    assert rows == [{"request": "p0/1", "task": "arith", "weight_version": 4, "code": "INTERNAL",
                     "message": "reward kind 'rule' failed: ValueError: boom"}]
    assert rewards.failures == 1 == failures_logged(tmp_path)
    rewards.close()
    assert pool.closed


@pytest.mark.parametrize("info, reward, correct", [
    ({"correct": "true"}, 0.2, True), ({"correct": "false"}, 1.0, False), ({}, 1.0, True), ({}, 0.99, False),
])
def test_correct_is_the_reward_kinds_verdict_else_reward_one(info, reward, correct):
    assert outcome_of(RewardResult(reward, "rule", info, "w", 0.0)) == Outcome(reward, correct)
