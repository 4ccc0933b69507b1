"""Adding and removing SGS instances at run time: a real router process over real instances."""

from __future__ import annotations

import json
import signal
import threading
import time

import grpc
import pytest

from flows.processes import free_port
from services.common.types import GenerateParams, PromptSpec
from tests.conftest import FAST_ENGINE, stop_sgs
from tests.integration.test_router import start_instance, start_router

OVERRIDES = [
    FAST_ENGINE, "generation.max_new_tokens=120", "generation.max_inflight=2", "generation.forced_lengths=true",
    "generation.dispatch.policy=least_loaded", "scaleout.enabled=true", "scaleout.max_instances=3",
]


@pytest.fixture(scope="module")
def router(tmp_path_factory, tiny_checkpoint):
    first = start_instance(tmp_path_factory.mktemp("m-inst0"), tiny_checkpoint, OVERRIDES, 0)
    proc, client, log, timeline = start_router(tmp_path_factory.mktemp("m-router"), tiny_checkpoint,
                                               first.log.parent / "config.json", [first.address])
    extra = []
    yield client, first, timeline, extra, tmp_path_factory
    client.close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]
    for inst in [first, *extra]:
        if inst.proc.poll() is None:
            stop_sgs(inst)


def _prompts(tag: str, lengths: list[int]) -> list[PromptSpec]:
    return [PromptSpec(f"{tag}{i}", (1, 5, 6, 7), "", 0.0, n) for i, n in enumerate(lengths)]



@pytest.mark.parametrize(
    "address, wait_s, match",
    [("", 0.0, "host:port"), ("no-port", 0.0, "host:port"), ("127.0.0.1:0", 0.0, "[1, 65535]"),
     ("127.0.0.1:70000", 0.0, "[1, 65535]"), ("127.0.0.1:x", 0.0, "[1, 65535]"), ("a b:1", 0.0, "host:port"),
     ("127.0.0.1:5000", -1.0, "wait_s")],
)
def test_bad_membership_requests_are_invalid_argument(router, address, wait_s, match):
    client = router[0]
    for call in (client.add_instance, client.remove_instance):
        with pytest.raises(grpc.RpcError) as err:
            call(address, wait_s=wait_s)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and match in err.value.details()


def test_refused_membership_changes_name_the_reason(router):
    client, first = router[0], router[1]
    cases = [
        (lambda: client.add_instance(first.address, wait_s=5), grpc.StatusCode.ALREADY_EXISTS, "already routed"),
        (lambda: client.add_instance(f"127.0.0.1:{free_port()}", wait_s=1), grpc.StatusCode.UNAVAILABLE,
         "did not answer"),
        (lambda: client.add_instance(client.address, wait_s=5), grpc.StatusCode.INVALID_ARGUMENT, "is an SGS router"),
        (lambda: client.remove_instance("127.0.0.1:1", wait_s=1), grpc.StatusCode.NOT_FOUND, "no routed instance"),
        (lambda: client.remove_instance(first.address, wait_s=1), grpc.StatusCode.FAILED_PRECONDITION, "last instance"),
    ]
    for call, code, match in cases:
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == code and match in err.value.details()
    assert len(list(client.generate(_prompts("ok", [2]), GenerateParams()))) == 1  # still serving


def test_added_instance_gets_current_weights_then_work_and_removal_loses_nothing(router, tiny_checkpoint):
    from services.generation.client import GenerationClient
    from services.policy.model import load_policy

    client, first, timeline, extra, factory = router
    state = load_policy(tiny_checkpoint).model.state_dict()
    assert client.update_weights(state, version=1, chunk_bytes=4096).staged  # before the new instance exists
    second = start_instance(factory.mktemp("m-inst1"), tiny_checkpoint, OVERRIDES, 1)
    extra.append(second)
    instances, version = client.add_instance(second.address, wait_s=60)
    assert instances == [first.address, second.address] and version == 1
    with GenerationClient(second.address) as direct:
        assert direct.health().pending_version >= 1 or direct.health().weight_version == 1

    samples = list(client.generate(_prompts("a", [5] * 6), GenerateParams(samples_per_prompt=2, min_weight_version=1)))
    assert len(samples) == 12 and {s.weight_version for s in samples} == {1}
    dispatched = [json.loads(x) for x in timeline.read_text().splitlines() if '"dispatch"' in x][-1]
    assert dispatched["per_instance"][1] > 0  # the new instance got work

    # remove the new instance while it holds in-flight work: it finishes it, nothing is lost or re-run
    results: list = []
    reader = threading.Thread(
        target=lambda: results.extend(client.generate(_prompts("b", [60] * 4), GenerateParams(samples_per_prompt=2)))
    )
    reader.start()
    time.sleep(1.0)
    instances, drained = client.remove_instance(second.address, wait_s=120)
    reader.join(timeout=120)
    assert instances == [first.address]
    keys = sorted((s.prompt_id, s.sample_index) for s in results)
    assert keys == sorted((f"b{i}", k) for i in range(4) for k in range(2))
    assert all(len(s.token_ids) == 60 for s in results)
    events = [json.loads(x) for x in timeline.read_text().splitlines()]
    removal = [e for e in events if e["event"] == "remove_instance"][-1]
    assert removal["in_flight"] == drained
    after = list(client.generate(_prompts("c", [3] * 4), GenerateParams()))
    assert len(after) == 4
    assert [json.loads(x) for x in timeline.read_text().splitlines() if '"dispatch"' in x][-1]["per_instance"][1] == 0
