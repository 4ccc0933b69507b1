"""Bad input at every gRPC method of real service processes (property-based; ``bench/fuzz_services.py``).

A relay, an SGS instance (hf engine) pulling from it, the router over the instance, an environment
worker and a reward worker run as processes on loopback. Each method gets a few hypothesis
examples per variant (protobuf messages built to be wrong, raw random bytes): the reply is OK or an
allowed status with a message, never UNKNOWN/INTERNAL, and every process stays alive and healthy;
afterwards nothing is lost (the relay serves every held version byte-exact, a fresh version goes in
and out, greedy generation is unchanged, an expert's episode plays and scores as before).
``bench/fuzz.py`` runs the same properties with many more examples. The explicit
regression tests below are the inputs that crashed or wedged a service before the fixes.
"""

from __future__ import annotations

import math

import grpc
import pytest

from bench.fuzz_services import Tally, cases, run_case
from bench.fuzz_stack import Stack
from services.proto import braid_pb2 as pb

EXAMPLES = 10  # per (service, method, variant): ~430 inputs in all; bench/fuzz.py runs thousands


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_checkpoint):
    s = Stack(tmp_path_factory.mktemp("fuzz"), tiny_checkpoint).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tally():
    return Tally()


@pytest.mark.parametrize("service,method,variant", cases(), ids=lambda x: x)
def test_bad_input_gets_a_clear_status_and_no_service_dies(stack, tally, service, method, variant):
    run_case(stack, service, method, variant, EXAMPLES, tally)
    assert sum(tally.counts[service][method].values()) >= EXAMPLES


def test_nothing_is_lost_after_the_fuzzing(stack, tally):
    lost = stack.check_nothing_lost()
    assert lost["greedy_unchanged"] and lost["episode_unchanged"]
    assert not tally.crashes


# ---------------------------------------------------------------- regressions (inputs that crashed or wedged a service)
def _code(stack, service, method, request, timeout_s=10.0):
    code, details, _ = stack.call(service, method, request, timeout_s=timeout_s)
    stack.check_alive()
    return code, details


@pytest.mark.parametrize("service,method", [("relay", "Versions"), ("relay", "Push"), ("sgs", "Generate"),
                                            ("router", "UpdateWeights"), ("sgs", "PullWeights")])
def test_bytes_that_do_not_parse_are_invalid_argument_not_internal(stack, service, method):
    request = [b"\x12\xff\xff"] if method in ("Push", "UpdateWeights") else b"\xff\xff\xff"
    code, details = _code(stack, service, method, request)
    assert code == "INVALID_ARGUMENT" and "malformed request" in details, (code, details)


def test_a_nan_wait_is_refused_instead_of_waiting_forever(stack):
    assert _code(stack, "relay", "Pull", pb.PullRequest(version=10**12, wait_s=math.nan), 5.0)[0] == "INVALID_ARGUMENT"
    req = pb.TransferRequest(direction="pull", version=10**12, wait_s=math.nan)
    assert _code(stack, "relay", "OpenTransfer", req, 5.0)[0] == "INVALID_ARGUMENT"
    for service in ("sgs", "router"):
        code, details = _code(stack, service, "PullWeights", pb.PullWeightsRequest(version=-1, wait_s=math.nan))
        assert code == "INVALID_ARGUMENT" and "wait_s" in details, (service, code, details)


def test_a_version_larger_than_the_relay_can_hold_is_resource_exhausted(stack):
    for nbytes, chunk_bytes in ((1 << 50, 1 << 30), (1 << 30, 1)):  # beyond memory; a billion chunks
        head = pb.PushMessage(manifest=pb.WeightManifest(version=10**15, chunk_bytes=chunk_bytes, tensors=[
            pb.TensorEntry(name="w", dtype="float32", shape=[nbytes // 4], nbytes=nbytes, offset=0)]))
        code, details = _code(stack, "relay", "Push", [head])
        assert code == "RESOURCE_EXHAUSTED", (code, details)
    assert all(v.version != 10**15 for v in stack.relay_versions().versions)


def test_push_by_reference_to_a_directory_is_refused(stack):
    from services.weights.blob import host_id

    shm_dir = f"/dev/shm/braid-relay-{stack.sup.services[0].proc.pid}"
    head = pb.PushMessage(manifest=pb.WeightManifest(
        version=10**15, chunk_bytes=8, shm_path=shm_dir, host_id=host_id(),
        tensors=[pb.TensorEntry(name="w", dtype="float32", shape=[4], nbytes=16, offset=0)]))
    code, details = _code(stack, "relay", "Push", [head])
    assert code == "INVALID_ARGUMENT" and "not a file" in details, (code, details)


@pytest.mark.parametrize("branches,upstream", [([[]], ""), ([["not an address"]], ""), ([], "zz"),
                                               ([["127.0.0.1:1"]] * 300, "")])
def test_a_malformed_chain_plan_is_refused(stack, branches, upstream):
    req = pb.ChainRequest(epoch=0, branches=[pb.Branch(relays=b) for b in branches], upstream=upstream)
    code, details = _code(stack, "relay", "SetChain", req)
    assert code == "INVALID_ARGUMENT" and details, (code, details)


def test_add_instance_stops_waiting_when_its_caller_gives_up(stack):
    """More AddInstance calls than the router has threads, each asking to wait a day for an
    address that never answers, each giving up after 1 s: the router must still answer."""
    add = stack.channels["router"].unary_unary("/braid.v1.Generation/AddInstance",
                                               request_serializer=pb.InstanceRequest.SerializeToString)
    calls = [add.future(pb.InstanceRequest(address="127.0.0.1:1", wait_s=86400.0), timeout=1.0) for _ in range(40)]
    assert {c.exception().code().name for c in calls} <= {"UNAVAILABLE", "DEADLINE_EXCEEDED"}
    stack.health("router")


def test_a_pull_waiting_for_a_version_stops_when_its_caller_gives_up(stack):
    """More pulls than the relay has threads, each of a version that never comes with a wait of
    1e308 s (600 s once clamped), each giving up after 1 s: the relay must still answer."""
    pull = stack.channels["relay"].unary_stream("/braid.v1.WeightRelay/Pull",
                                                request_serializer=pb.PullRequest.SerializeToString)
    transfer = stack.channels["relay"].unary_unary("/braid.v1.WeightRelay/OpenTransfer",
                                                   request_serializer=pb.TransferRequest.SerializeToString)
    calls = [transfer.future(pb.TransferRequest(direction="pull", version=10**12, wait_s=1e308), timeout=1.0)
             for _ in range(20)]
    streams = [pull(pb.PullRequest(version=10**12, wait_s=1e308), timeout=1.0) for _ in range(20)]
    assert {c.exception().code().name for c in calls} <= {"DEADLINE_EXCEEDED", "NOT_FOUND"}
    for s in streams:
        with pytest.raises(grpc.RpcError):
            list(s)
    stack.relay_versions()
