"""The SGS router as a real process in front of two real instance processes (loopback, port 0)."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import grpc
import pytest

from services.common.types import GenerateParams, PromptSpec
from tests.conftest import FAST_ENGINE, ROOT, SGSProcess, spawn_service, start_sgs, stop_sgs
from tests.integration.runs import kill_instance_after_first_step

OVERRIDES = [
    FAST_ENGINE, "generation.max_new_tokens=120", "generation.max_inflight=2", "generation.forced_lengths=true",
    "generation.admission=lpt", "generation.instances=2", "generation.dispatch.policy=lpt",
    "generation.dispatch.min_history=4",
]


def start_instance(workdir: Path, checkpoint: Path, overrides: list[str], index: int) -> SGSProcess:
    return start_sgs(workdir, checkpoint, overrides, instance=index)


@pytest.fixture(scope="module")
def genlog_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("genlog") / "gen.sqlite"


def start_router(workdir: Path, checkpoint: Path, config: Path, instances: list[str]):
    """The router process over ``instances``; returns (process, a ready client, log, timeline)."""
    from services.generation.client import GenerationClient

    port_file, log, timeline = workdir / "router.port", workdir / "router.log", workdir / "timeline.jsonl"
    proc, ports = spawn_service(
        ["services.generation.router_main", "--config", str(config), "--model", str(checkpoint),
         "--instances", ",".join(instances), "--port", "0", "--port-file", str(port_file), "--timeline", str(timeline)],
        port_file, log, what="router",
    )
    client = GenerationClient(f"127.0.0.1:{ports[0]}", max_message_mb=8)
    client.wait_ready()
    return proc, client, log, timeline


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_checkpoint, genlog_path):
    overrides = [*OVERRIDES, f"generation.genlog={genlog_path}"]
    instances = [start_instance(tmp_path_factory.mktemp(f"inst{i}"), tiny_checkpoint, overrides, i) for i in range(2)]
    proc, client, log, timeline = start_router(tmp_path_factory.mktemp("router"), tiny_checkpoint,
                                               instances[0].log.parent / "config.json", [i.address for i in instances])
    yield client, instances, timeline
    client.close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]
    for inst in instances:
        if inst.proc.poll() is None:
            stop_sgs(inst)


def _prompts(lengths: list[int], estimates: list[float] | None = None) -> list[PromptSpec]:
    est = estimates or [0.0] * len(lengths)
    return [PromptSpec(f"p{i}", (1, 5, 6, 7), "", est[i], n) for i, n in enumerate(lengths)]


def test_streams_are_merged_every_sample_once_with_forced_lengths(stack):
    client, _, timeline = stack
    lengths = [3, 40, 9, 25, 60, 5]
    samples = list(client.generate(_prompts(lengths, [float(n) for n in lengths]),
                                   GenerateParams(samples_per_prompt=3)))
    keys = sorted((s.prompt_id, s.sample_index) for s in samples)
    assert keys == sorted((f"p{i}", k) for i in range(len(lengths)) for k in range(3))  # each exactly once
    for s in samples:
        assert len(s.token_ids) == lengths[int(s.prompt_id[1:])] and s.finish_reason == "length"
        assert s.group_id == s.prompt_id
    assert samples[0].finished_at < samples[-1].finished_at  # completion order: a short one first
    events = [json.loads(line) for line in timeline.read_text().splitlines()]
    dispatched = [e for e in events if e["event"] == "dispatch"][-1]
    assert dispatched["policy"] == "lpt" and dispatched["estimates"] == "request"
    assert all(n > 0 for n in dispatched["per_instance"]) and sum(dispatched["per_instance"]) == 18
    seen = [e for e in events if e["event"] == "sample" and e["call"] == dispatched["call"]]
    assert sorted(e["instance"] for e in seen) == sorted(
        i for i, n in enumerate(dispatched["per_instance"]) for _ in range(n))


def test_instances_append_finished_samples_to_the_generation_log(stack, genlog_path):
    from ranker.genlog import GenerationLog

    client, _, _ = stack
    lengths = [7, 11, 13]
    list(client.generate([PromptSpec(f"g{i}", (1, 5, 6, 7), "", 0.0, n) for i, n in enumerate(lengths)],
                         GenerateParams(samples_per_prompt=2)))
    with GenerationLog(genlog_path) as log:
        deadline = time.monotonic() + 30
        rows = []
        while time.monotonic() < deadline:
            rows = [r for r in log.recent(10_000) if r.prompt_id.startswith("g")]
            if len(rows) >= 6:
                break
            time.sleep(0.2)
    assert sorted(r.response_length for r in rows) == sorted(lengths * 2)
    assert {r.instance for r in rows} == {0, 1} and all(r.prompt == "123" and r.weight_version == 0 for r in rows)


def test_request_without_estimates_is_served_round_robin(stack):
    client, _, timeline = stack
    samples = list(client.generate(_prompts([4, 4, 4, 4]), GenerateParams(samples_per_prompt=2)))
    assert len(samples) == 8
    dispatched = [json.loads(x) for x in timeline.read_text().splitlines() if '"dispatch"' in x][-1]
    assert dispatched["estimates"] == "none" and dispatched["notes"]["fallback"].startswith("round_robin")
    assert dispatched["per_instance"] == [4, 4]


def test_instance_admits_longest_estimate_first(stack, tiny_checkpoint):
    from services.generation.client import GenerationClient

    _, instances, _ = stack
    est = [10.0, 80.0, 40.0, 60.0, 20.0]
    with GenerationClient(instances[1].address) as direct:  # max_inflight = 2: LPT decides who waits
        samples = list(direct.generate(_prompts([int(e) for e in est], est), GenerateParams()))
    by_start = [int(s.prompt_id[1:]) for s in sorted(samples, key=lambda s: s.started_at)]
    assert set(by_start[:2]) == {1, 3}  # 80 and 60 start first (FCFS would start 10 and 80)
    assert by_start[2] == 2  # then 40 when a slot frees


@pytest.mark.parametrize(
    "prompts, params, match",
    [
        ([], GenerateParams(), "no prompts"),
        ([PromptSpec("a", (1, 5)), PromptSpec("a", (1, 6))], GenerateParams(), "duplicate prompt_id"),
        ([PromptSpec("a", (1, 5), "", 0.0, 500)], GenerateParams(), "forced length 500 is outside"),
        ([PromptSpec("a", (1, 5), "", -3.0)], GenerateParams(), "estimated_length must be finite"),
        ([PromptSpec("a", (1, 99))], GenerateParams(), "outside [0,"),
        ([PromptSpec("a", (1, 5), task="no spaces")], GenerateParams(), "task tag may hold only"),
    ],
)
def test_bad_requests_are_refused_with_clear_status(stack, prompts, params, match):
    client, _, _ = stack
    with pytest.raises(grpc.RpcError) as err:
        list(client.generate(prompts, params))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and match in err.value.details()
    assert len(list(client.generate(_prompts([2]), GenerateParams()))) == 1  # still serving


def test_a_seeded_call_is_reproduced_through_the_router_wherever_its_samples_run(stack):
    """The router forwards ``GenerateParams.seed``; each sample's seed depends on its identity, not
    on the instance the dispatch put it on, so a repeated call (another order, other placements)
    gives the same samples."""
    client, _, timeline = stack
    params = GenerateParams(samples_per_prompt=1, max_new_tokens=12, temperature=1.0, seed=7)
    ps = [PromptSpec(f"s{i}", (1, 5, 6, 7)) for i in range(6)]
    first = {s.prompt_id: s.token_ids for s in client.generate(ps, params)}
    again = {s.prompt_id: s.token_ids for s in client.generate(ps[::-1], params)}
    assert again == first and len(set(first.values())) == 6
    events = [json.loads(x) for x in timeline.read_text().splitlines()]
    calls = [e["call"] for e in events if e["event"] == "dispatch"][-2:]
    placed = [{e["seq"]: e["instance"] for e in events if e["event"] == "sample" and e["call"] == c} for c in calls]
    assert placed[0] != placed[1]  # the two calls ran samples on other instances


def test_weights_fan_out_to_every_instance(stack, tiny_checkpoint):
    from services.generation.client import GenerationClient
    from services.policy.model import load_policy

    client, instances, _ = stack
    state = load_policy(tiny_checkpoint).model.state_dict()
    ack = client.update_weights(state, version=1, chunk_bytes=4096)
    assert ack.staged and ack.version == 1
    for inst in instances:
        with GenerationClient(inst.address) as direct:
            deadline = time.monotonic() + 30
            while direct.health().weight_version != 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert direct.health().weight_version == 1
    samples = list(client.generate(_prompts([3, 3]), GenerateParams(min_weight_version=1)))
    assert {s.weight_version for s in samples} == {1}
    with pytest.raises(grpc.RpcError) as err:
        client.update_weights(state, version=1, chunk_bytes=4096)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "instance" in err.value.details()


def test_estimator_is_injected_for_prompts_without_estimates(stack, tiny_checkpoint):
    """RouterCore in-process over the real instances, with a fake estimator (the ranker's slot)."""
    from services.common.config import load_config
    from services.generation.client import GenerationClient
    from services.generation.router import RouterCore
    from services.policy.model import load_policy

    _, instances, _ = stack
    tok = load_policy(tiny_checkpoint).tokenizer
    seen: list[list[str]] = []

    class LengthOfText:
        def predict(self, prompts: list[str]) -> list[float]:
            seen.append(prompts)
            return [float(len(p)) for p in prompts]

    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", OVERRIDES).generation
    clients = [GenerationClient(i.address) for i in instances]
    core = RouterCore(clients, cfg, estimator=lambda: LengthOfText(), decode=lambda ids: tok.decode(list(ids)))
    texts = ["12-3>10=", "250-9>200="]
    prompts = [PromptSpec("x", tuple(tok.encode(texts[0])), "", 0.0, 4),
               PromptSpec("y", tuple(tok.encode(texts[1])), "", 7.0, 4)]
    call = core.start(prompts, GenerateParams(samples_per_prompt=2))
    assert len(list(core.results(call))) == 4
    assert call.estimate_source == "mixed" and seen == [[texts[0]]]  # only the prompt without an estimate

    class Broken:
        def predict(self, prompts: list[str]) -> list[float]:
            raise RuntimeError("ranker exploded")

    core.estimator = lambda: Broken()
    call = core.start(prompts[:1], GenerateParams(samples_per_prompt=2))
    assert len(list(core.results(call))) == 2 and call.estimate_source == "none" and core.estimator_failures == 1
    for c in clients:
        c.close()


POOLS = [
    "generation.pools=[{name: compute, hardware: H800, instances: [0]}, "
    "{name: bandwidth, hardware: H20, instances: [1]}]",
    "generation.affinity={calculator: compute, math: bandwidth}", "generation.dispatch.policy=round_robin",
]


@pytest.fixture(scope="module")
def pooled(stack, tmp_path_factory, tiny_checkpoint):
    """A second router process over the same two instances, with one pool per instance and a
    task -> pool map (RollArt's hardware affinity; docs/affinity.md)."""
    from services.common.config import load_config, write_config

    workdir = tmp_path_factory.mktemp("pooled")
    write_config(load_config(ROOT / "deploy/configs/smoke.yaml", [*OVERRIDES, *POOLS]), workdir / "config.json")
    proc, client, log, timeline = start_router(workdir, tiny_checkpoint, workdir / "config.json",
                                               [i.address for i in stack[1]])
    yield client, stack[1], timeline
    client.close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]


def test_each_task_runs_only_on_its_pool(pooled):
    client, _, timeline = pooled
    tasks = ["calculator", "math", "math", "calculator", "math", "calculator"]
    prompts = [PromptSpec(f"t{i}", (1, 5, 6, 7), "", 0.0, 3 + i, task) for i, task in enumerate(tasks)]
    samples = list(client.generate(prompts, GenerateParams(samples_per_prompt=3)))
    assert sorted((s.prompt_id, s.sample_index) for s in samples) == sorted(
        (p.prompt_id, k) for p in prompts for k in range(3))
    events = [json.loads(line) for line in timeline.read_text().splitlines()]
    dispatched = [e for e in events if e["event"] == "dispatch"][-1]
    assert {p["pool"]: (p["hardware"], p["tasks"], p["instances"], p["sequences"]) for p in dispatched["pools"]} == {
        "compute": ("H800", ["calculator"], [0], 9), "bandwidth": ("H20", ["math"], [1], 9)}
    ran = [(e["task"], e["pool"], e["instance"]) for e in events
           if e["event"] == "sample" and e["call"] == dispatched["call"]]
    assert sorted(ran) == sorted([("calculator", "compute", 0)] * 9 + [("math", "bandwidth", 1)] * 9)


def test_a_task_without_a_pool_is_refused_and_a_pool_keeps_its_last_instance(pooled):
    client, instances, timeline = pooled
    before = timeline.read_text().count('"dispatch"')
    mixed = [PromptSpec("ok", (1, 5), "", 0.0, 2, "math"), PromptSpec("lost", (1, 5), "", 0.0, 2, "walk")]
    with pytest.raises(grpc.RpcError) as err:
        list(client.generate(mixed, GenerateParams()))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert ("task 'walk' has no pool: generation.affinity lists ['calculator', 'math'] and no 'default'"
            in err.value.details())
    assert timeline.read_text().count('"dispatch"') == before  # nothing was dispatched
    with pytest.raises(grpc.RpcError) as err:
        client.remove_instance(instances[0].address, wait_s=1)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert ("last instance of pool 'compute', which generation.affinity routes tasks ['calculator'] to"
            in err.value.details())
    assert [s.prompt_id for s in client.generate(mixed[:1], GenerateParams())] == ["ok"]  # still serving


def test_lost_instance_is_reported_as_unavailable_and_takes_no_more_work(stack):
    client, instances, timeline = stack
    stop_sgs(instances[0])
    with pytest.raises(grpc.RpcError) as err:
        list(client.generate(_prompts([3] * 4), GenerateParams(samples_per_prompt=2)))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "instance" in err.value.details()
    # the router marked it lost on its table: the next request runs on the instance left
    samples = list(client.generate(_prompts([3] * 4), GenerateParams(samples_per_prompt=2)))
    assert len(samples) == 8
    assert [json.loads(x) for x in timeline.read_text().splitlines() if '"dispatch"' in x][-1]["per_instance"] == [0, 8]


@pytest.mark.parametrize("mode, policy, transport", [
    pytest.param("one_step", "streamrl", "relay", marks=pytest.mark.long),  # `make test-long` (docs/testing.md)
    pytest.param("sync", "lpt", "direct", marks=pytest.mark.long),
])
def test_trainer_runs_through_the_router(tmp_path, tiny_checkpoint, mode, policy, transport):
    """The launcher puts the router in front of 2 instances; the trainer sees one SGS. Weights
    reach the instances through the router either way: each pulls from its relay (relay), or
    the router forwards the trainer's stream (direct). In the one-step run an instance is killed
    after the first step: the launcher starts it again on its port, and the orchestrator, which
    lost the router meanwhile (its Health fails while an instance is away), readmits it."""
    from flows.launcher import run_processes
    from services.common.config import load_config, write_config
    from services.generation.scheduling.models import spec_from_hf_config
    from services.generation.scheduling.profiles import ProfileModel, load_profile, save_profile, shipped_profile

    # the shipped CPU profile is for the default tiny model; the smoke model is smaller: re-label a copy
    smoke = spec_from_hf_config("smoke", json.loads((tiny_checkpoint / "config.json").read_text()), dtype_bytes=4)
    profile = load_profile(shipped_profile("cpu-local-braid-tiny"))
    profile = profile.model_copy(update={"model": ProfileModel(name="smoke", fingerprint=smoke.fingerprint())})
    save_profile(profile, tmp_path / "profile.json")
    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", [FAST_ENGINE,
        f"trainer.mode={mode}", "generation.instances=2", "generation.dispatch.router='on'",
        f"generation.dispatch.policy={policy}", "eval.prompts=8",
        f"generation.dispatch.profile={tmp_path / 'profile.json'}", f"weights.transport={transport}",
        *(["trainer.iterations=5", "generation.step_delay_ms=[10, 10]"] if mode == "one_step" else []),
    ])
    write_config(cfg, tmp_path / "config.json")
    (tmp_path / "metrics.jsonl").write_text("")
    killed: list[int] = []
    kill = kill_instance_after_first_step(tmp_path, killed) if mode == "one_step" else None
    summary = json.loads(run_processes(tmp_path, str(tiny_checkpoint), on_poll=kill, poll_s=0.2).read_text())
    assert summary["final_weight_version"] == cfg.trainer.iterations
    events = [json.loads(x) for x in (tmp_path / "router-timeline.jsonl").read_text().splitlines()]
    dispatched = [e for e in events if e["event"] == "dispatch"]
    assert len(dispatched) >= cfg.trainer.iterations and all(e["policy"] == policy for e in dispatched)
    # the orchestrator sends one call per group; the router plans a routing round's calls together
    assert max(e["round_calls"] for e in dispatched) > 1, [e["round_calls"] for e in dispatched]
    assert {e["instance"] for e in events if e["event"] == "sample"} == {0, 1}
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["samples"] for r in rows] == (
        [cfg.trainer.prompts_per_iteration * cfg.trainer.group_size] * cfg.trainer.iterations)
    assert rows[-1].get("instances_readmitted", 0) == len(killed) == (mode == "one_step"), (killed, rows[-1])
    # versions each instance pulled from its relay, in order (the newest-version sender may skip
    # versions an instance was too busy to take: only the newest matters)
    pulled = [[int(v) for v in re.findall(r"pulled and staged weight version (\d+) from relay",
                                          (tmp_path / f"sgs-{i}.log").read_text())]
              for i in range(2)]
    if transport == "relay":
        assert all(p and p == sorted(set(p)) for p in pulled), pulled
        assert max(max(p) for p in pulled) >= cfg.trainer.iterations - 1, pulled
    else:
        assert pulled == [[], []]
