"""The weight relay as real processes on loopback: push/pull paths, locking, integrity, bad input."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest
import torch

from services.common.weights import blob_chunk, chunk_digest, version_digest
from services.proto import braid_pb2 as pb
from services.weights.client import RelayClient, RelayError, snapshot_blob
from services.weights.convert import manifest_to_pb
from services.weights.wire import encode_chunk
from tests.integration.relays import model_state, running_relay, start_relay, state_equals

SHM = Path("/dev/shm")
CHUNK = 16 * 1024


@pytest.fixture(scope="module")
def relay(tmp_path_factory):
    with running_relay(tmp_path_factory.mktemp("relay"), "r0", "--keep", "2", faults="corrupt_chunk=3") as (r, client):
        assert client.push(snapshot_blob(model_state(1.0), CHUNK, SHM), 1, streams=2)
        yield r, client


_equal = state_equals


def test_pull_paths_are_byte_exact_and_a_corrupted_chunk_is_refetched(relay):
    r, client = relay
    shm = client.pull(1, allow_shm=True)
    assert shm.path == "shm" and _equal(shm.state, 1.0)
    grpc_client = RelayClient(r.address, data_path="grpc")
    streamed = grpc_client.pull(1, allow_shm=False, streams=3)  # the relay flips a byte of chunk 3 once
    grpc_client.close()
    assert streamed.path == "stream" and _equal(streamed.state, 1.0)
    assert streamed.refetched == 1 and streamed.digest == shm.digest
    tcp = client.pull(1, allow_shm=False)  # the raw-TCP data channel (the default network path)
    assert tcp.path == "tcp" and _equal(tcp.state, 1.0) and tcp.digest == shm.digest


def _raw_push(client, messages):
    return client.push_stream(iter(messages))


def _messages(state, version, *, edit=None, order=None):
    wb = snapshot_blob(state, CHUNK, None)
    m = wb.manifest
    digests = [chunk_digest(wb.blob.view[r.blob_offset : r.blob_offset + r.length]) for r in m.plan]
    chunks = [blob_chunk(m, wb.blob.view, r, version, digests[r.index]) for r in m.plan]
    if edit:
        chunks = edit(chunks)
    msgs = [pb.PushMessage(manifest=manifest_to_pb(m, version), parts=1)]
    msgs += [encode_chunk(c, c.data) for c in (order(chunks) if order else chunks)]
    msgs.append(pb.PushMessage(version_digest=version_digest(digests)))
    return msgs


def _flip(chunks, i=1):
    c = chunks[i]
    chunks[i] = type(c)(**{**c.__dict__, "data": bytes([c.data[0] ^ 1]) + bytes(c.data[1:])})
    return chunks


def _rename(chunks):
    chunks[0] = type(chunks[0])(**{**chunks[0].__dict__, "name": "layer.0.w"})
    return chunks


OTHER_MODEL = {"other.weight": torch.zeros(10, 10)}


@pytest.mark.parametrize(
    "make, code, match",
    [
        (lambda: _messages(model_state(2.0), 2, edit=_flip), grpc.StatusCode.DATA_LOSS, "digest mismatch"),
        (lambda: [*_messages(model_state(2.0), 2)[:-1], pb.PushMessage(version_digest="sha256:" + "0" * 64)],
         grpc.StatusCode.DATA_LOSS, "version digest mismatch"),
        (lambda: _messages(model_state(2.0), 2, order=lambda cs: [cs[1], cs[0], *cs[2:]]),
         grpc.StatusCode.INVALID_ARGUMENT, "out of order or duplicated"),
        (lambda: _messages(model_state(2.0), 2, order=lambda cs: [cs[0], cs[0], *cs[1:]]),
         grpc.StatusCode.INVALID_ARGUMENT, "out of order or duplicated"),
        (lambda: _messages(OTHER_MODEL, 2), grpc.StatusCode.FAILED_PRECONDITION, "different model"),
        (lambda: _messages(model_state(2.0), 1), grpc.StatusCode.ALREADY_EXISTS, "already held"),
        (lambda: _messages(model_state(2.0), 2, edit=_rename), grpc.StatusCode.INVALID_ARGUMENT, "the manifest says"),
        (lambda: _messages(model_state(2.0), 2)[1:], grpc.StatusCode.INVALID_ARGUMENT, "must carry the manifest"),
    ],
)
def test_bad_pushes_are_refused_and_nothing_held_is_damaged(relay, make, code, match):
    _, client = relay
    with pytest.raises(RelayError) as err:
        _raw_push(client, make())
    assert err.value.code == code, str(err.value)
    assert match in str(err.value)
    info = client.versions()
    assert info.held == [1] and _equal(client.pull(1, allow_shm=False).state, 1.0)


def test_unknown_version_is_refused_naming_the_versions_held(relay):
    _, client = relay
    with pytest.raises(RelayError) as err:
        client.pull(7, allow_shm=False)
    assert err.value.code == grpc.StatusCode.NOT_FOUND and "versions held: [1]" in str(err.value)


def test_concurrent_pulls_during_pushes_never_see_a_torn_version(tmp_path):
    r = start_relay(tmp_path, "rt", "--keep", "3")
    client = RelayClient(r.address)
    try:
        client.wait_ready()
        client.push(snapshot_blob(model_state(1.0, scale=8), CHUNK, None), 1)
        seen: list[tuple[int, bool]] = []
        stop = threading.Event()
        errors: list[BaseException] = []

        def reader(shm: bool) -> None:
            reader_client = RelayClient(r.address)
            try:
                while not stop.is_set():
                    got = reader_client.pull(-1, allow_shm=shm, streams=2)
                    fill = float(got.version)
                    seen.append((got.version, _equal_scaled(got.state, fill)))
            except BaseException as exc:  # noqa: BLE001 - surfaced below
                errors.append(exc)
            finally:
                reader_client.close()

        threads = [threading.Thread(target=reader, args=(shm,)) for shm in (True, False, False)]
        for t in threads:
            t.start()
        for v in range(2, 7):  # each version's values equal its number: a torn read would mix them
            client.push(snapshot_blob(model_state(float(v), scale=8), CHUNK, None), v, streams=2)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        assert seen and all(ok for _, ok in seen), [s for s in seen if not s[1]][:3]
        assert {v for v, _ in seen} - {1} and client.versions().held == [4, 5, 6]
    finally:
        client.close()
        r.stop()


def _equal_scaled(state, fill):
    return all(bool((t == fill).all()) for t in state.values())


def test_evicted_version_gives_a_clear_error(tmp_path):
    r = start_relay(tmp_path, "re", "--keep", "2")
    client = RelayClient(r.address)
    try:
        client.wait_ready()
        for v in (1, 2, 3):
            client.push(snapshot_blob(model_state(float(v)), CHUNK, SHM), v)
        with pytest.raises(RelayError) as err:
            client.pull(1)
        assert err.value.code == grpc.StatusCode.NOT_FOUND
        assert "version 1 is not held (evicted or never pushed); versions held: [2, 3]" in str(err.value)
        assert _equal(client.pull(3).state, 3.0)
    finally:
        client.close()
        r.stop()
