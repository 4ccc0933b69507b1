"""The reward worker's mechanism (services/reward/worker.py) with a fake reward function whose
calls block until the test releases them: admission, queueing, timeouts, statuses, counters."""

from __future__ import annotations

import threading
import time

import pytest

from services.common.reward_config import RewardConfig
from services.reward.protocol import InvalidRequest, RewardRequest, Scored
from services.reward.worker import RewardRequestError, RewardWorker


class GatedReward:
    """A fake kind: each call waits for ``gate``; the prompt picks the outcome."""

    kind = "rule"

    def __init__(self) -> None:
        self.gate = threading.Event()

    def score(self, request: RewardRequest) -> Scored:
        self.gate.wait(30)
        if request.prompt == "inconsistent":
            raise InvalidRequest("turn 2: the observation '=1,' differs")
        if request.prompt == "bug":
            raise ZeroDivisionError("division by zero")
        return Scored(1.0, {"prompt": request.prompt})


def req(prompt: str = "p", task: str = "calculator", request_id: str = "r") -> RewardRequest:
    return RewardRequest(request_id, task, 0, prompt, (), ())


def wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def code_of(fn, *args) -> tuple[str, str]:
    with pytest.raises(RewardRequestError) as err:
        fn(*args)
    return err.value.code, str(err.value)


def background(worker: RewardWorker, request: RewardRequest, out: list) -> threading.Thread:
    def run():
        try:
            out.append(worker.score(request))
        except RewardRequestError as err:
            out.append(err.code)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_full_worker_refuses_and_the_counters_add_up():
    fake = GatedReward()
    worker = RewardWorker(RewardConfig(threads=1, max_queue=1), fake, "w")
    out: list = []
    a = background(worker, req("a"), out)
    wait_for(lambda: worker.health().in_flight == 1 and worker.health().queued == 0)  # scoring
    b = background(worker, req("b"), out)
    wait_for(lambda: worker.health().queued == 1)
    code, message = code_of(worker.score, req("c"))
    assert code == "RESOURCE_EXHAUSTED" and "reward.max_queue 1" in message
    fake.gate.set()
    a.join(30)
    b.join(30)
    assert sorted(r.info["prompt"] for r in out) == ["a", "b"] and {r.worker for r in out} == {"w"}
    h = worker.health()
    assert (h.in_flight, h.queued, h.served, h.threads, h.max_queue, h.kind) == (0, 0, 2, 1, 1, "rule")
    assert h.busy_s > 0 and all(r.score_s > 0 and r.kind == "rule" for r in out)
    worker.shutdown()


def test_statuses_of_bad_requests_and_failing_kinds():
    fake = GatedReward()
    fake.gate.set()
    worker = RewardWorker(RewardConfig(), fake, "w")
    assert code_of(worker.score, req(task="chess"))[0] == "INVALID_ARGUMENT"
    assert code_of(worker.score, req(request_id="x" * 300))[0] == "INVALID_ARGUMENT"
    code, message = code_of(worker.score, req("inconsistent"))
    assert code == "INVALID_ARGUMENT" and message.startswith("turn 2:")
    code, message = code_of(worker.score, req("bug"))
    assert code == "INTERNAL" and "ZeroDivisionError" in message
    assert worker.score(req("fine")).reward == 1.0 and worker.health().served == 1
    worker.shutdown()


def test_slow_scores_are_deadline_exceeded():
    fake = GatedReward()
    worker = RewardWorker(RewardConfig(timeout_s=0.2), fake, "w")
    code, message = code_of(worker.score, req())
    assert code == "DEADLINE_EXCEEDED" and "reward.timeout_s (0.2s)" in message
    fake.gate.set()
    slow = RewardConfig(timeout_s=0.2, latency={"kind": "fixed", "mean_s": 30.0})
    code, message = code_of(RewardWorker(slow, fake, "w").score, req())  # the sleep stops at the budget
    assert code == "DEADLINE_EXCEEDED" and "reward.timeout_s (0.2s)" in message


def test_shutdown_answers_waiting_and_new_requests_unavailable():
    fake = GatedReward()
    worker = RewardWorker(RewardConfig(threads=1, max_queue=4, latency={"kind": "fixed", "mean_s": 30.0}), fake, "w")
    out: list = []
    threads = [background(worker, req(request_id=f"r{i}"), out) for i in range(3)]  # one sleeping, two queued
    wait_for(lambda: worker.health().in_flight == 3)
    worker.shutdown()
    for t in threads:
        t.join(30)
    assert out == ["UNAVAILABLE"] * 3
    assert code_of(worker.score, req())[0] == "UNAVAILABLE"
