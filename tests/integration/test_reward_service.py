"""The reward worker as a real process on loopback: Score and Health, every refusal with its status,
unparseable bytes on each method, a full queue and slow scores, the model kind served and refused."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from services.agentic.calculator import CalculatorEnv, demonstration
from services.common.config import load_config
from services.proto import braid_pb2 as pb
from services.reward.client import RewardClient, RewardError
from services.reward.protocol import MAX_TEXT_CHARS, RewardRequest
from tests.conftest import ROOT, spawn_service, stop_service

AGENTIC = load_config(None, []).agentic


class Worker:
    def __init__(self, workdir: Path, name: str, overrides: list[str]) -> None:
        args = ["services.reward", "--port", "0", "--port-file", str(workdir / f"{name}.port"), "--worker-id", name]
        for o in overrides:
            args += ["--set", o]
        self.proc, ports = spawn_service(args, workdir / f"{name}.port", workdir / f"{name}.log",
                                         what=f"reward worker {name}")
        self.address = f"127.0.0.1:{ports[0]}"
        self.client = RewardClient(self.address, timeout_s=30)
        self.client.wait_ready()

    def stop(self) -> int:
        self.client.close()
        return stop_service(self.proc)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    w = Worker(tmp_path_factory.mktemp("reward"), "r0", ["reward.threads=4", "reward.max_queue=8"])
    yield w
    assert w.stop() == 0


def calculator_transcript(seed: int) -> RewardRequest:
    env = CalculatorEnv.from_config(AGENTIC)
    prompt = env.reset(seed).text
    actions = demonstration(env.problem)
    observations = [env.step(CalculatorEnv.parse_action(a)).observation.text for a in actions]
    return RewardRequest(f"t{seed}", "calculator", seed, prompt, tuple(actions), tuple(observations))


def code_of(fn, *args, **kw) -> tuple[str, str]:
    with pytest.raises(RewardError) as err:
        fn(*args, **kw)
    return err.value.code, err.value.message


def test_score_and_health_through_the_service(worker):
    c = worker.client
    right = c.score(calculator_transcript(3))
    assert right.reward == 1.0 and right.kind == "rule" and right.worker == "r0" and right.info["correct"] == "true"
    assert right.score_s >= 0.0
    arith = c.score(RewardRequest("a", "arith", 0, "247-9>200=", ("238,229,220,211,202,193#193",), ()))
    assert arith.reward == 1.0 and arith.info == {"correct": "true"}
    h = c.health()
    assert (h.worker_id, h.kind, h.threads, h.max_queue, h.in_flight, h.queued) == ("r0", "rule", 4, 8, 0, 0)
    assert h.served >= 2 and h.busy_s > 0.0


def test_bad_requests_get_clear_statuses_and_the_worker_lives(worker):
    c = worker.client
    good = calculator_transcript(4)
    served = c.health().served
    cases = [
        (RewardRequest("r", "chess", 0, "", (), ()), "unknown task 'chess'"),
        (RewardRequest("x" * 257, "calculator", 0, "", (), ()), "request_id of 257 characters"),
        (RewardRequest("r", "walk", 0, "", (">" * (MAX_TEXT_CHARS + 1),), ("",)), "action 0 of 4097 characters"),
        (RewardRequest("r", "calculator", 4, good.prompt, good.actions, ("=7,", *good.observations[1:])),
         "turn 0: the observation '=7,' differs from the environment's"),
        (RewardRequest("r", "calculator", 5, good.prompt, good.actions, good.observations),
         "not the first observation"),
        (RewardRequest("r", "arith", 0, "hello", ("#1",), ()), "not a count-down prompt"),
    ]
    for request, fragment in cases:
        code, message = code_of(c.score, request)
        assert code == "INVALID_ARGUMENT" and fragment in message, (code, message)
    assert c.health().served == served and worker.proc.poll() is None


def test_every_method_answers_bytes_that_do_not_parse_with_invalid_argument(worker):
    methods = [m.name for m in pb.DESCRIPTOR.services_by_name["Reward"].methods]
    assert methods == ["Score", "Health"]
    with grpc.insecure_channel(worker.address) as channel:
        for method in methods:
            with pytest.raises(grpc.RpcError) as err:
                channel.unary_unary(f"/braid.v1.Reward/{method}")(b"\xff\xff\xff", timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed request" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:  # field 1 (request_id, a string) holding invalid UTF-8
            channel.unary_unary("/braid.v1.Reward/Score")(b"\x0a\x02\xc3\x28", timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert worker.client.health().worker_id == "r0"


def _wait(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_a_full_worker_refuses_and_slow_scores_time_out(tmp_path):
    # one thread, one queue slot, every score 10 s of injected latency against a 5 s budget
    w = Worker(tmp_path, "busy", ["reward.threads=1", "reward.max_queue=1", "reward.timeout_s=5",
                                   "reward.latency.kind=fixed", "reward.latency.mean_s=10"])
    out: dict[str, tuple[str, str]] = {}

    def send(name: str) -> threading.Thread:
        t = threading.Thread(target=lambda: out.__setitem__(name, code_of(w.client.score, calculator_transcript(1))))
        t.start()
        return t

    try:
        a = send("a")
        _wait(lambda: w.client.health().in_flight == 1)
        b = send("b")
        _wait(lambda: w.client.health().queued == 1)
        code, message = code_of(w.client.score, calculator_transcript(2))
        assert code == "RESOURCE_EXHAUSTED" and "reward.max_queue 1" in message
        a.join(30)
        b.join(30)
        assert [out[k][0] for k in "ab"] == ["DEADLINE_EXCEEDED"] * 2
        assert all("longer than reward.timeout_s (5.0s) on worker busy" in out[k][1] for k in "ab")
        h = w.client.health()
        assert (h.served, h.in_flight) == (0, 0) and h.busy_s > 0.0
    finally:
        assert w.stop() == 0


def _run_worker(*overrides: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "services.reward", "--port", "0"]
    for o in overrides:
        args += ["--set", o]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_model_worker_without_a_loadable_model_refuses_to_start(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    proc = _run_worker("reward.kind=model", f"reward.model_path={tmp_path}")
    assert proc.returncode == 2 and "missing tokenizer.json, reward_meta.json" in proc.stderr
    proc = _run_worker("reward.kind=model")
    assert proc.returncode == 2 and "reward.kind 'model' needs reward.model_path" in proc.stderr


@pytest.mark.slow  # torch and transformers load in the test and in the worker: 12 to 40 s here, with the load
def test_a_model_worker_scores_with_its_classifier(tmp_path):
    from services.reward.model import ClassifierSpec, build_classifier, save_classifier

    model, tok = build_classifier(ClassifierSpec())  # untrained: the service does not care
    save_classifier(model, tok, tmp_path / "model", {"tasks": ["calculator"], "max_tokens": 256})
    w = Worker(tmp_path, "m0", ["reward.kind=model", f"reward.model_path={tmp_path / 'model'}"])
    try:
        scored = w.client.score(calculator_transcript(3))
        assert (scored.kind == "model" and 0.0 <= scored.reward <= 1.0
                and scored.info["p_correct"] == f"{scored.reward:.4f}")
        code, message = code_of(w.client.score, RewardRequest("r", "walk", 0, "3,5=", (">>",), ("",)))
        assert code == "INVALID_ARGUMENT" and "trained on tasks ['calculator']" in message
        assert w.client.health().kind == "model"
    finally:
        assert w.stop() == 0
