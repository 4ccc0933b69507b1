"""The environment worker as real processes on loopback: the service, its refusals, a worker
killed mid-trajectory, and multi-turn trajectories against a real SGS process (hf engine)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from services.agentic.calculator import CalculatorEnv, demonstration
from services.agentic.client import EnvClient, EnvError
from services.agentic.manager import Limits
from services.agentic.protocol import MAX_ACTION_CHARS
from services.agentic.runner import PolicyCodec, SgsGenerator, ThreadedEnv, make_managers, run_trajectory_level
from services.common.config import load_config
from services.proto import braid_pb2 as pb
from tests.conftest import FAST_ENGINE, spawn_service, start_sgs, stop_service, stop_sgs
from tests.unit.test_agentic_manager import CODEC, ScriptedGenerator, calc_scripts


class Worker:
    def __init__(self, workdir: Path, name: str, overrides: list[str]) -> None:
        args = ["services.agentic", "--port", "0", "--port-file", str(workdir / f"{name}.port"), "--id", name]
        for o in overrides:
            args += ["--set", o]
        self.proc, ports = spawn_service(args, workdir / f"{name}.port", workdir / f"{name}.log",
                                         what=f"env worker {name}")
        self.address = f"127.0.0.1:{ports[0]}"
        self.client = EnvClient(self.address, timeout_s=10)
        self.client.wait_ready()

    def stop(self) -> int:
        self.client.close_channel()
        return stop_service(self.proc)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    w = Worker(tmp_path_factory.mktemp("env"), "w0", ["agentic.max_sessions=16", "agentic.step_timeout_s=0.5"])
    yield w
    assert w.stop() == 0


def test_reset_step_close_through_the_service(worker):
    c = worker.client
    sid, obs = c.reset("calculator", 11, "traj-11")
    env = CalculatorEnv.from_config(load_config(None, []).agentic)
    assert obs == env.reset(11).text
    for k, text in enumerate(demonstration(env.problem)):
        out = c.step(sid, k, text)
        assert out.turn == k + 1 and c.step(sid, k, text) == out  # a retried step is answered again, not re-applied
    assert out.done and out.reward == 1.0 and out.info["correct"] == "true"
    assert c.close(sid) == k + 1
    health = c.health()
    assert health.worker_id == "w0" and health.sessions == 0 and list(health.kinds) == ["calculator", "walk"]


def _code(fn, *args, **kw) -> tuple[str, str]:
    with pytest.raises(EnvError) as err:
        fn(*args, **kw)
    return err.value.code, str(err.value)


def test_bad_requests_get_clear_statuses_and_the_worker_lives(worker):
    c = worker.client
    sid, _ = c.reset("walk", 1)
    cases = [
        (lambda: c.reset("chess", 0), "INVALID_ARGUMENT", "unknown environment kind 'chess'"),
        (lambda: c.reset("", 0), "INVALID_ARGUMENT", "unknown environment kind ''"),
        (lambda: c.reset("walk", 0, "x" * 257), "INVALID_ARGUMENT", "trajectory_id"),
        (lambda: c.step("nope", 0, ">"), "NOT_FOUND", "no session 'nope'"),
        (lambda: c.close("nope"), "NOT_FOUND", "no session"),
        (lambda: c.step(sid, 3, ">"), "FAILED_PRECONDITION", "is at turn 0, not 3"),
        (lambda: c.step(sid, 0, ">" * (MAX_ACTION_CHARS + 1)), "INVALID_ARGUMENT", "limit is 4096"),
    ]
    for call, code, fragment in cases:
        got, message = _code(call)
        assert got == code and fragment in message, (code, got, message)
    assert c.step(sid, 0, "not a move").info["event"] == "invalid"  # bad text is an invalid action, not an error
    opened = [c.reset("walk", s)[0] for s in range(16 - c.health().sessions)]
    assert _code(c.reset, "walk", 99)[0] == "RESOURCE_EXHAUSTED"
    for s in [*opened, sid]:
        c.close(s)
    assert c.health().sessions == 0 and worker.proc.poll() is None


def test_every_method_answers_bytes_that_do_not_parse_with_invalid_argument(worker):
    methods = [m.name for m in pb.DESCRIPTOR.services_by_name["Environment"].methods]
    assert methods == ["Reset", "Step", "Close", "Health"]
    with grpc.insecure_channel(worker.address) as channel:
        for method in methods:
            with pytest.raises(grpc.RpcError) as err:
                channel.unary_unary(f"/braid.v1.Environment/{method}")(b"\xff\xff\xff", timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed request" in err.value.details()
        bad_utf8 = b"\x0a\x02\xc3\x28"  # field 1 (a string) holding invalid UTF-8
        for method in ("Reset", "Step", "Close"):
            with pytest.raises(grpc.RpcError) as err:
                channel.unary_unary(f"/braid.v1.Environment/{method}")(bad_utf8, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert worker.client.health().worker_id == "w0"


def test_slow_steps_run_concurrently_and_time_out_alone(tmp_path):
    w = Worker(tmp_path, "slow", ["agentic.latency.kind=fixed", "agentic.latency.mean_s=0.5",
                                  "agentic.step_timeout_s=2"])
    try:
        sids = [w.client.reset("walk", s)[0] for s in range(8)]
        outs: list = []
        threads = [threading.Thread(target=lambda s=s: outs.append(w.client.step(s, 0, ">"))) for s in sids]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(outs) == 8 and time.monotonic() - t0 < 2.5  # 8 x 0.5 s in parallel, not 4 s in series
        assert all(o.latency_s == 0.5 and o.step_s >= 0.5 for o in outs)
    finally:
        assert w.stop() == 0
    w = Worker(tmp_path, "late", ["agentic.latency.kind=fixed", "agentic.latency.mean_s=1.0",
                                  "agentic.step_timeout_s=0.3"])
    try:
        sid, _ = w.client.reset("walk", 0)
        code, message = _code(w.client.step, sid, 0, ">")
        assert code == "DEADLINE_EXCEEDED" and "longer than 0.3s" in message
        assert _code(w.client.step, sid, 0, ">")[0] == "FAILED_PRECONDITION"
    finally:
        assert w.stop() == 0


def _kill_after_steps(worker: Worker, steps: int) -> None:
    while worker.client.health().steps < steps:
        time.sleep(0.02)
    worker.proc.kill()


def test_a_worker_killed_mid_trajectory_costs_only_its_trajectories(tmp_path):
    overrides = ["agentic.latency.kind=fixed", "agentic.latency.mean_s=0.2", "agentic.calculator.min_steps=4"]
    a, b = Worker(tmp_path, "a", overrides), Worker(tmp_path, "b", overrides)
    cfg = load_config(None, [*overrides, "agentic.step_retries=2", "agentic.retry_backoff_s=0.05"]).agentic
    scripts = calc_scripts(cfg, list(range(6)))
    try:
        with ThreadPoolExecutor(16) as ex:
            backends = [ThreadedEnv(a.client, ex), ThreadedEnv(b.client, ex)]  # t0, t2, t4 on a; t1, t3, t5 on b
            managers = make_managers([(t, int(t[1:])) for t in scripts], "calculator", backends,
                                     ScriptedGenerator(scripts), CODEC, Limits.from_config(cfg))
            threading.Thread(target=_kill_after_steps, args=(b, 6), daemon=True).start()  # mid-trajectory on b
            result = asyncio.run(run_trajectory_level(managers, concurrency=6))
        assert sorted(t.trajectory_id for t in result.trajectories) == ["t0", "t2", "t4"]
        assert all(t.reward == 1.0 and t.status == "done" for t in result.trajectories)
        assert sorted(d.trajectory_id for d in result.dropped) == ["t1", "t3", "t5"]
        assert all(d.code == "UNAVAILABLE" and d.turns_done >= 1 and "after 3 attempts" in d.reason
                   for d in result.dropped)
        assert a.client.health().sessions == 0
    finally:
        a.stop()
        b.stop()


def test_multi_turn_trajectories_against_a_real_sgs(tmp_path, tiny_checkpoint):
    from services.generation.client import GenerationClient
    from services.policy.model import load_policy

    sgs = start_sgs(tmp_path, tiny_checkpoint, [FAST_ENGINE, "generation.max_new_tokens=8"])
    overrides = ["agentic.max_turns=3", "agentic.max_new_tokens_per_turn=6", "agentic.max_context_tokens=64"]
    w = Worker(tmp_path, "e2e", overrides)
    cfg = load_config(None, overrides).agentic
    policy = load_policy(tiny_checkpoint)
    codec = PolicyCodec(policy)
    samples: dict[str, list] = {}
    try:
        client = GenerationClient(sgs.address)
        client.wait_ready()
        with ThreadPoolExecutor(16) as ex:
            gen = SgsGenerator(client, ex,
                               on_sample=lambda s: samples.setdefault(s.prompt_id.rsplit("/t", 1)[0], []).append(s))
            managers = make_managers([(f"e{i}", i) for i in range(4)], "calculator", [ThreadedEnv(w.client, ex)], gen,
                                     codec, Limits.from_config(cfg))
            result = asyncio.run(run_trajectory_level(managers, concurrency=4))
        client.close()
    finally:
        w.stop()
        assert stop_sgs(sgs) == 0, sgs.log.read_text()[-2000:]
    assert not result.dropped and len(result.trajectories) == 4
    env = CalculatorEnv.from_config(cfg)
    for t in result.trajectories:
        assert t.token_ids[:t.prompt_len] == tuple(policy.encode_prompt(env.reset(t.seed).text))
        assert ([s.token_ids for s in samples[t.trajectory_id]]
                == [t.token_ids[u.gen_start:u.gen_start + u.gen_len] for u in t.turns])
        for u, s in zip(t.turns, samples[t.trajectory_id], strict=True):
            span = slice(u.gen_start, u.gen_start + u.gen_len)
            assert s.prompt_token_ids == t.token_ids[:u.gen_start]  # token in: the whole running context
            assert t.logprobs[span] == tuple(s.logprobs) and all(lp <= 0 for lp in s.logprobs)
            assert set(t.loss_mask[span]) == {1} and u.weight_version == s.weight_version == 0
            assert u.action_text == policy.decode(list(s.token_ids))
            obs = t.token_ids[span.stop:span.stop + u.obs_len]
            assert (set(t.loss_mask[span.stop:span.stop + u.obs_len]) <= {0}
                    and set(t.logprobs[span.stop:span.stop + u.obs_len]) <= {0.0})
            assert (policy.decode(list(obs)) == env.step(CalculatorEnv.parse_action(u.action_text)).observation.text
                    if obs else True)
        assert (sum(t.loss_mask) == sum(u.gen_len for u in t.turns)
                and len(t.token_ids) == len(t.loss_mask) == len(t.logprobs))
    assert sum(t.num_turns for t in result.trajectories) > 4  # random weights: invalid turns continue, so several turns
