"""Rewards of single-turn samples: every completion is scored by the reward service.

Single-turn runs take the road agentic runs take (RollArt's serverless reward): the trainer sends
each finished completion with its item's prompt, reference and row (``services.tasks.source.
reward_request``) to the run's reward pool (``services.reward.client.RewardPool``: least-loaded
worker, retries elsewhere on UNAVAILABLE / DEADLINE_EXCEEDED / RESOURCE_EXHAUSTED) and goes on
reading the stream: ``submit`` returns a future, resolved on one of ``threads`` client threads,
so scoring overlaps generation and the learner's backward passes; the runners wait on a group's
futures only when the group is complete.

A score that fails for good — the user's reward function raised or returned something that is
not a reward (INTERNAL), took longer than ``reward.timeout_s`` on every try, or the request was
refused — never stops the run: the sample gets reward 0 and counts as incorrect, the failure is
counted (``reward_failures`` in the iteration's metrics) and appended to
``reward-failures.jsonl`` in the run directory (prompt, sample, status, message), and the first
``LOGGED`` failures are logged.
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from services.common.types import SampleRecord
from services.reward.client import RewardError
from services.reward.protocol import RewardRequest, RewardResult
from services.tasks.source import TaskItem, reward_request

log = logging.getLogger("braid.rewards")
FAILURES = "reward-failures.jsonl"
LOGGED = 20  # failures written to the trainer's log (all of them go to the failures file)


class Pool(Protocol):
    def score(self, request: RewardRequest) -> RewardResult: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class Outcome:
    """One sample's reward: the value trained on, whether it is correct (accuracy), and why it
    failed ("" when scored)."""

    reward: float
    correct: bool
    failure: str = ""


def outcome_of(result: RewardResult) -> Outcome:
    """A scored result: correct as the reward kind says (``info["correct"]``), else reward 1."""
    flag = result.info.get("correct")
    return Outcome(result.reward, flag == "true" if flag is not None else result.reward >= 1.0)


def failures_logged(run_dir: Path) -> int:
    """Reward failures ``reward-failures.jsonl`` holds (every trainer attempt of the run appends there)."""
    path = run_dir / FAILURES
    return sum(1 for line in path.read_text().splitlines() if line.strip()) if path.exists() else 0


class ServiceRewards:
    """``submit(item, sample, completion)`` -> future of the sample's ``Outcome``; thread-safe."""

    def __init__(self, pool: Pool, run_dir: Path | None = None, threads: int = 8) -> None:
        self.pool = pool
        self.path = run_dir / FAILURES if run_dir is not None else None
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="reward-client")
        self._lock = threading.Lock()
        self.failures = 0

    def submit(self, item: TaskItem, sample: SampleRecord, completion: str) -> Future[Outcome]:
        request = reward_request(item, completion, f"{sample.prompt_id}/{sample.sample_index}")
        return self._executor.submit(self._score, request, sample.weight_version)

    def _score(self, request: RewardRequest, version: int) -> Outcome:
        try:
            return outcome_of(self.pool.score(request))
        except RewardError as err:
            self._record(request, version, err)
            return Outcome(0.0, False, f"{err.code}: {err.message}")

    def _record(self, request: RewardRequest, version: int, err: RewardError) -> None:
        with self._lock:
            self.failures += 1
            n = self.failures
            if self.path is not None:
                row = {"request": request.request_id, "task": request.task, "weight_version": version,
                       "code": err.code, "message": err.message[:2000]}
                with self.path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
        if n <= LOGGED:
            log.warning("reward of %s failed (%s): %s%s", request.request_id, err.code, err.message[:500],
                        "" if n < LOGGED else f" (further failures only in {FAILURES})")

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.pool.close()
