"""The environment worker's session table (the mechanism behind the gRPC service), in process."""

from __future__ import annotations

import threading
import time

import pytest

from services.agentic.calculator import CalculatorEnv, demonstration
from services.agentic.protocol import MAX_ACTION_CHARS
from services.agentic.sessions import EnvRequestError, SessionTable
from services.common.config import load_config


def table(*overrides: str, **kw) -> SessionTable:
    return SessionTable(load_config(None, list(overrides)).agentic, **kw)


def code_of(fn, *args) -> str:
    with pytest.raises(EnvRequestError) as err:
        fn(*args)
    return err.value.code


def test_reset_step_close_and_turn_idempotency():
    t = table()
    sid, obs = t.reset("calculator", 5, "traj-5")
    env = CalculatorEnv.from_config(t.cfg)
    assert obs == env.reset(5).text
    turns = demonstration(env.problem)
    first = t.step(sid, 0, turns[0])
    assert first.turn == 1 and t.step(sid, 0, turns[0]) == first and t.steps == 1  # a retry replays, no second step
    assert code_of(t.step, sid, 0, "1-1") == "FAILED_PRECONDITION"  # another action for a turn already applied
    assert code_of(t.step, sid, 5, turns[1]) == "FAILED_PRECONDITION"
    for k, text in enumerate(turns[1:], start=1):
        out = t.step(sid, k, text)
    assert out.done and out.reward == 1.0
    assert code_of(t.step, sid, len(turns), "1-1") == "FAILED_PRECONDITION"  # the episode is over
    assert t.close(sid) == len(turns) and len(t) == 0
    assert code_of(t.close, sid) == code_of(t.step, sid, 0, "1-1") == "NOT_FOUND"


def test_bad_requests_get_their_codes():
    t = table("agentic.max_sessions=2")
    assert code_of(t.reset, "chess", 0, "") == "INVALID_ARGUMENT"
    assert code_of(t.reset, "walk", 0, "x" * 300) == "INVALID_ARGUMENT"
    sid, _ = t.reset("walk", 0, "")
    t.reset("walk", 1, "")
    assert code_of(t.reset, "walk", 2, "") == "RESOURCE_EXHAUSTED"
    assert code_of(t.step, sid, 0, ">" * (MAX_ACTION_CHARS + 1)) == "INVALID_ARGUMENT"


def test_a_slow_step_times_out_and_poisons_only_its_session():
    t = table("agentic.latency.kind=fixed", "agentic.latency.mean_s=0.5", "agentic.step_timeout_s=0.2")
    slow, _ = t.reset("walk", 0, "")
    assert code_of(t.step, slow, 0, ">") == "DEADLINE_EXCEEDED"
    assert code_of(t.step, slow, 0, ">") == "FAILED_PRECONDITION"
    fast = table()
    sid, _ = fast.reset("walk", 0, "")
    assert fast.step(sid, 0, ">").turn == 1


def test_steps_of_different_sessions_run_concurrently_and_one_session_steps_one_at_a_time():
    t = table("agentic.latency.kind=fixed", "agentic.latency.mean_s=0.3")
    sids = [t.reset("walk", s, "")[0] for s in range(8)]
    codes: list[str] = []

    def step(sid: str) -> None:
        try:
            t.step(sid, 0, ">")
            codes.append("OK")
        except EnvRequestError as err:
            codes.append(err.code)

    threads = [threading.Thread(target=step, args=(s,)) for s in [*sids, sids[0]]]
    t0 = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert time.monotonic() - t0 < 1.5  # 9 steps of 0.3 s each, not in series
    assert sorted(codes) == ["ABORTED"] + ["OK"] * 8


def test_idle_sessions_are_evicted():
    now = [0.0]
    t = table("agentic.session_ttl_s=10", clock=lambda: now[0])
    a, _ = t.reset("walk", 0, "")
    now[0] = 5.0
    t.reset("walk", 1, "")
    now[0] = 12.0
    assert t.evict_idle() == [a] and len(t) == 1
