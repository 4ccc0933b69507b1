"""The reward pool as real processes: a client pool that loses a worker mid-run (kill -9) and still
scores every request, the Supervisor restarting it on its port, and the controller scaling the
pool out under injected-latency load and back in when idle, with every request answered."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from flows.processes import Supervisor
from flows.reward_pool import RewardPoolController
from services.agentic.calculator import CalculatorEnv, demonstration
from services.common.config import load_config, write_config
from services.reward.client import RewardClient, read_membership
from services.reward.protocol import RewardRequest

AGENTIC = load_config(None, []).agentic


def transcript(seed: int) -> RewardRequest:
    env = CalculatorEnv.from_config(AGENTIC)
    prompt = env.reset(seed).text
    actions = demonstration(env.problem)
    observations = [env.step(CalculatorEnv.parse_action(a)).observation.text for a in actions]
    return RewardRequest(f"t{seed}", "calculator", seed, prompt, tuple(actions), tuple(observations))


def controller(run_dir: Path, overrides: list[str], max_restarts: int = 0) -> tuple[Supervisor, RewardPoolController]:
    cfg = load_config(None, overrides)
    write_config(cfg, run_dir / "config.json")
    sup = Supervisor(run_dir, max_restarts)
    return sup, RewardPoolController(sup, run_dir, cfg)


def wait_for(predicate, timeout_s: float = 60.0, every=None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        if every is not None:
            every()
        time.sleep(0.1)


def test_a_pool_that_loses_a_worker_mid_run_scores_every_request(tmp_path):
    sup, ctl = controller(tmp_path, ["reward.workers=2", "reward.threads=2", "reward.latency.kind=fixed",
                                     "reward.latency.mean_s=0.1", "reward.retry_backoff_s=0.02"], max_restarts=1)
    try:
        first, second = ctl.start()
        assert read_membership(ctl.membership) == (1, [first, second])
        victim = next(svc for svc in sup.services if svc.name == "reward-1")
        killed_at: list[float] = []

        def kill_when_busy() -> None:
            with RewardClient(second) as c:
                wait_for(lambda: c.health().served >= 5 and c.health().in_flight > 0)
            os.kill(victim.proc.pid, signal.SIGKILL)
            killed_at.append(time.monotonic())

        killer = threading.Thread(target=kill_when_busy, daemon=True)
        killer.start()
        pool = ctl.pool()
        finished: list[float] = []

        def score(seed: int):
            result = pool.score(transcript(seed))
            finished.append(time.monotonic())
            return result

        with ThreadPoolExecutor(8) as ex:
            results = list(ex.map(score, range(80)))
        killer.join(30)
        assert killed_at and max(finished) > killed_at[0]  # the kill came mid-run
        assert len(results) == 80 and all(r.reward == 1.0 for r in results)
        assert {r.worker for r in results} == {"reward-0", "reward-1"}
        wait_for(lambda: victim.proc.poll() is not None)
        sup.check()  # restarts reward-1 on its port: the membership file stays as it was
        assert sup.restarts == {"reward-1": 1} and read_membership(ctl.membership) == (1, [first, second])
        later = [pool.score(transcript(s)) for s in range(8)]
        assert "reward-1" in {r.worker for r in later} and all(r.reward == 1.0 for r in later)
        pool.close()
    finally:
        ctl.close()
        sup.stop_all()


def test_the_controller_scales_out_under_load_and_back_in_when_idle(tmp_path):
    sup, ctl = controller(tmp_path, [
        "reward.workers=1", "reward.threads=2", "reward.latency.kind=fixed", "reward.latency.mean_s=0.2",
        "reward.scaling.enabled=true", "reward.scaling.min_workers=1", "reward.scaling.max_workers=3",
        "reward.scaling.high_utilisation=0.7", "reward.scaling.low_utilisation=0.2", "reward.scaling.window_s=1.0",
        "reward.scaling.cooldown_s=0.5",
    ])
    stop = threading.Event()
    answered: list[float] = []
    sent = [0]

    def load(offset: int) -> None:  # one caller scoring back to back
        seed = offset
        while not stop.is_set():
            sent[0] += 1
            answered.append(pool.score(transcript(seed)).reward)
            seed += 8

    def step() -> None:
        sup.check()
        ctl.poll()

    try:
        ctl.start()
        pool = ctl.pool()
        with ThreadPoolExecutor(6) as ex:
            callers = [ex.submit(load, i) for i in range(6)]  # 6 calls in flight: 3 workers' worth of threads
            wait_for(lambda: len(ctl.addresses) == 3, every=step)
            with RewardClient(ctl.addresses[-1]) as newest:
                wait_for(lambda: newest.health().served > 0, every=step)  # the pools found the new worker
            stop.set()
            for c in callers:
                c.result(timeout=60)  # a failed call would raise here
        wait_for(lambda: len(ctl.addresses) == 1, every=step)
        ctl.wait()
        assert len(answered) == sent[0] and set(answered) == {1.0}
        events = [json.loads(line) for line in ctl.events_path.read_text().splitlines()]
        assert ([e["event"] for e in events if e["event"] in ("scale_out", "scale_in")]
                == ["scale_out"] * 2 + ["scale_in"] * 2)
        # the newest leaves first
        assert [e["name"] for e in events if e["event"] == "scale_in"] == ["reward-2", "reward-1"]
        assert all(e["action"] in ("out", "in", "hold") and "reason" in e for e in events if e["event"] == "decision")
        assert read_membership(ctl.membership)[1] == ctl.addresses and len(pool.workers()) == 1
        assert [s.name for s in sup.services] == ["reward-0"]  # the removed workers exited and were let go
        pool.close()
    finally:
        stop.set()
        ctl.close()
        sup.stop_all()
