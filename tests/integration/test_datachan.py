"""The relay's raw-TCP data channel as real processes on loopback: tokens, bad streams, resume,
re-fetch, fallback to gRPC, byte-identical versions on every path, TLS."""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from contextlib import contextmanager, suppress
from pathlib import Path

import grpc
import pytest
import torch

from flows.processes import free_port
from services.common.weights import chunk_digest, version_digest
from services.proto import braid_pb2 as pb
from services.weights import datachan as dc
from services.weights import datapath
from services.weights.client import RelayClient, RelayError, snapshot_blob
from services.weights.convert import manifest_to_pb
from tests.integration.relays import model_state, running_relay, start_relay, state_equals, wait_for

SHM = Path("/dev/shm")
CHUNK = 16 * 1024


@pytest.fixture(scope="module")
def relay(tmp_path_factory):
    faults = "corrupt_chunk=2;truncate_pull=3"
    with running_relay(tmp_path_factory.mktemp("datachan"), "d0", "--keep", "3", faults=faults) as (r, client):
        yield r, client


_equal = state_equals


def _connect(client: RelayClient, grant, direction: int, version: int | None = None, token: bytes | None = None):
    sock = dc.connect("127.0.0.1", grant.port)
    dc.open_stream(sock, direction, grant.version if version is None else version, token or grant.token)
    return sock


def _pull_grant(client: RelayClient, version: int) -> pb.TransferGrant:
    return client.open_transfer(pb.TransferRequest(direction="pull", version=version))


def _refused(sock) -> str:
    with sock:
        code, message = dc.read_status(sock)
    assert code == grpc.StatusCode.PERMISSION_DENIED.value[0]
    return message


def test_every_path_gives_byte_identical_versions_with_resume_and_refetch(relay, caplog):
    r, client = relay
    assert client.push(snapshot_blob(model_state(1.0), CHUNK, None), 1, use_shm=False)  # over the data channel
    with caplog.at_level(logging.WARNING, logger="braid.weights.client"):
        # the relay cuts this stream after 3 chunks once and corrupts chunk 2 once
        tcp = client.pull(1, allow_shm=False)
    assert tcp.path == "tcp" and tcp.refetched == 1 and _equal(tcp.state, 1.0)
    # 2: corrupted, re-fetched
    assert "pull of version 1 broke" in caplog.text and "resuming from chunk 2" in caplog.text
    grpc_client = RelayClient(r.address, data_path="grpc")
    try:
        streamed = grpc_client.pull(1, allow_shm=False, streams=2)
        shm = client.pull(1, allow_shm=True)
        assert streamed.path == "stream" and shm.path == "shm"
        assert tcp.digest == streamed.digest == shm.digest
        assert all(torch.equal(tcp.state[k], streamed.state[k]) and torch.equal(tcp.state[k], shm.state[k])
                   for k in tcp.state)
        # gRPC in, data channel out
        assert grpc_client.push(snapshot_blob(model_state(2.0), CHUNK, None), 2, use_shm=False)
        again = client.pull(2, allow_shm=False)
        assert again.path == "tcp" and _equal(again.state, 2.0)
        assert again.digest == grpc_client.pull(2, allow_shm=False).digest
    finally:
        grpc_client.close()


def test_bad_reused_and_mismatched_tokens_are_refused_and_nothing_is_touched(relay):
    r, client = relay
    held = client.versions().held
    v = held[-1]
    assert "unknown token" in _refused(_connect(client, _pull_grant(client, v), dc.PULL, token=b"\0" * dc.TOKEN_BYTES))
    grant = _pull_grant(client, v)
    with _connect(client, grant, dc.PULL) as ok:  # the token's one use
        assert dc.read_status(ok) == (0, "")
    assert "already used" in _refused(_connect(client, grant, dc.PULL))
    assert "not version" in _refused(_connect(client, _pull_grant(client, v), dc.PUSH))  # a pull token used to push
    assert "not version" in _refused(_connect(client, _pull_grant(client, v), dc.PULL, version=v + 100))
    with dc.connect("127.0.0.1", grant.port) as sock:  # not a braid stream at all
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"\0" * 64)
        code, message = dc.read_status(sock)
        assert code == grpc.StatusCode.PERMISSION_DENIED.value[0] and "not a braid data stream" in message
    assert client.versions().held == held and _equal(client.pull(v, allow_shm=False).state, float(v))
    assert "data connection from" in r.log.read_text()  # refusals are logged


def _frames(wb, version, *, flip=None, order=None, die_after=None):
    m = wb.manifest
    digests = [chunk_digest(wb.blob.view[x.blob_offset : x.blob_offset + x.length]) for x in m.plan]
    refs = order(list(m.plan)) if order else list(m.plan)
    for k, ref in enumerate(refs):
        if k == die_after:
            raise RuntimeError("the sender died")
        data = bytes(wb.blob.view[ref.blob_offset : ref.blob_offset + ref.length])
        if ref.index == flip:
            data = bytes([data[0] ^ 1]) + data[1:]
        yield ref.index, digests[ref.index], data
    yield dc.END, version_digest(digests), b""


def _push_frames(client, wb, version, frames):
    return client.push_data(wb.manifest, version, lambda start: frames)


@pytest.mark.parametrize("kind, code, match", [
    ("corrupt", grpc.StatusCode.DATA_LOSS, "digest mismatch"),
    ("order", grpc.StatusCode.INVALID_ARGUMENT, "out of order or duplicated"),
    ("duplicate", grpc.StatusCode.INVALID_ARGUMENT, "out of order or duplicated"),
])
def test_bad_push_streams_are_refused_with_a_status(relay, kind, code, match):
    _, client = relay
    held = client.versions().held
    v = held[-1] + 1
    wb = snapshot_blob(model_state(float(v)), CHUNK, None)
    frames = {
        "corrupt": lambda: _frames(wb, v, flip=1),
        "order": lambda: _frames(wb, v, order=lambda rs: [rs[1], rs[0], *rs[2:]]),
        "duplicate": lambda: _frames(wb, v, order=lambda rs: [rs[0], rs[0], *rs[1:]]),
    }[kind]()
    with pytest.raises(RelayError) as err:
        _push_frames(client, wb, v, frames)
    assert err.value.code == code and match in str(err.value), str(err.value)
    info = client.versions()
    assert info.held == held and v not in info.versions  # the refused version was dropped, nothing held touched


def test_a_truncated_push_keeps_its_prefix_and_the_next_push_resumes(relay):
    _, client = relay
    v = client.versions().held[-1] + 1
    wb = snapshot_blob(model_state(float(v)), CHUNK, None)
    with pytest.raises(RuntimeError, match="sender died"):  # after 3 chunks: the connection closes mid-version
        _push_frames(client, wb, v, _frames(wb, v, die_after=3))
    def held_chunks() -> int:
        state = client.versions().versions.get(v)
        return state.received if state is not None else -1

    wait_for(lambda: held_chunks() == 3, 20, "the relay to take the 3 chunks sent before the break")
    partial = client.versions().versions[v]
    assert not partial.complete and partial.received == 3
    grant = client.open_transfer(pb.TransferRequest(direction="push", version=v,
                                                    manifest=manifest_to_pb(wb.manifest, v)))
    assert grant.from_chunk == 3  # where a resumed push starts
    assert client.push(wb, v, use_shm=False)
    assert _equal(client.pull(v, allow_shm=False).state, float(v))


def test_a_relay_without_data_channel_is_served_over_grpc(tmp_path, caplog):
    r = start_relay(tmp_path, "nodata", "--no-data-channel")
    client = RelayClient(r.address)
    try:
        client.wait_ready()
        with caplog.at_level(logging.WARNING, logger="braid.weights.client"):
            assert client.push(snapshot_blob(model_state(1.0), CHUNK, None), 1, use_shm=False)
            got = client.pull(1, allow_shm=False)
        assert got.path == "stream" and _equal(got.state, 1.0)
        assert "falling back to gRPC streaming" in caplog.text
    finally:
        client.close()
        assert r.stop() == 0


def test_tls_data_channel_refuses_a_client_without_certificate(tmp_path):
    from services.common.certs import make_certs
    from tests.integration.test_weights_tls_sgs import _sites

    files = make_certs(_sites(tmp_path))
    relay = start_relay(tmp_path, "gen", "--tls-host", "127.0.0.1", "--tls-dir", str(tmp_path / "certs"),
                        "--site", "gen-site")
    trainer_side = RelayClient(relay.tls_address, tls=files["train-site"])
    try:
        # data channel over mutual TLS
        assert trainer_side.push(snapshot_blob(model_state(1.0), CHUNK, None), 1, use_shm=False)
        got = trainer_side.pull(1, allow_shm=False)
        assert got.path == "tcp" and _equal(got.state, 1.0)
        grant = _pull_grant(trainer_side, 1)
        assert grant.tls_port
        anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # trusts the CA but has no certificate of its own
        anonymous.load_verify_locations(files["train-site"].ca)
        with (pytest.raises((ssl.SSLError, ConnectionError, dc.Truncated)),
              anonymous.wrap_socket(socket.create_connection(("127.0.0.1", grant.tls_port), timeout=10),
                                    server_hostname="127.0.0.1") as sock):
            dc.open_stream(sock, dc.PULL, 1, grant.token)
            dc.read_status(sock)
        with socket.create_connection(("127.0.0.1", grant.tls_port), timeout=10) as sock:  # plaintext to the TLS port
            dc.open_stream(sock, dc.PULL, 1, grant.token)
            with pytest.raises((ConnectionError, dc.Truncated, OSError)):
                dc.read_status(sock)
        # a token granted over TLS is good only on the TLS data port
        assert "granted over TLS" in _refused(_connect(trainer_side, grant, dc.PULL))
        assert RelayClient(relay.address).versions().held == [1]
    finally:
        trainer_side.close()
        relay.stop()



class _Forwarder:
    """A plain TCP port forward (as a NAT or proxy in front of the relay would be); counts connections."""

    def __init__(self, target_port: int) -> None:
        self.target, self.connections, self.open = target_port, 0, []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.open += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def cut(self) -> None:
        """Close every forwarded connection (as a relay restart or a NAT timeout would)."""
        for sock in self.open:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.open = []

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 20):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@contextmanager
def _relay_behind_forward(tmp_path, name: str):
    """A relay whose data port sits behind a port forward it advertises; (forward, relay, client)."""
    bound = free_port()
    forward = _Forwarder(bound)
    relay = start_relay(tmp_path, name, "--data-port", str(bound), "--advertise-data-port", str(forward.port))
    client = RelayClient(relay.address)
    try:
        client.wait_ready()
        yield forward, relay, client
    finally:
        client.close()
        forward.listener.close()
        assert relay.stop() == 0


def test_grants_name_the_advertised_data_port_of_a_relay_behind_a_port_forward(tmp_path):
    with _relay_behind_forward(tmp_path, "nat") as (forward, relay, client):
        assert client.push(snapshot_blob(model_state(3.0), CHUNK, None), 1, use_shm=False)
        got = client.pull(1, allow_shm=False)
        assert got.path == "tcp" and _equal(got.state, 3.0)
        assert _pull_grant(client, 1).port == forward.port
        assert forward.connections == 1  # the push and the pull went through the forward, on one kept connection
        assert client.kept.reused == 1
        assert f"grants name {forward.port}" in relay.log.read_text()


def test_relay_refuses_a_port_out_of_range(capsys):
    from services.weights.__main__ import main

    with pytest.raises(SystemExit):
        main(["--advertise-tls-data-port", "70000"])
    assert "--advertise-tls-data-port must be a port number" in capsys.readouterr().err


def test_data_connections_are_kept_for_the_next_transfer_and_dropped_when_closed(tmp_path):
    """Keep-alive: consecutive transfers share one connection (no new handshake, the congestion
    window kept); a kept connection the other end closed is noticed and replaced, nothing fails."""
    with _relay_behind_forward(tmp_path, "keep") as (forward, relay, client):
        for v in (1, 2, 3):
            assert client.push(snapshot_blob(model_state(float(v)), CHUNK, None), v, use_shm=False)
            assert _equal(client.pull(v, allow_shm=False).state, float(v))
        assert forward.connections == 1 and client.kept.reused == 5
        forward.cut()
        wait_for(lambda: not datapath.quiet(client.kept._kept[forward.port][0][1]), 5, "the client sees the close")
        assert client.push(snapshot_blob(model_state(4.0), CHUNK, None), 4, use_shm=False)
        assert _equal(client.pull(4, allow_shm=False).state, 4.0)
        assert forward.connections == 2 and client.kept.reused == 6
        assert "no preamble" not in relay.log.read_text()  # a kept connection closing is not a refusal


def test_a_kept_connection_closed_after_its_check_is_retried_on_a_fresh_one(tmp_path, monkeypatch, caplog):
    """The race the check cannot close: the relay drops a kept connection just after the client
    found it open (simulated: the check always passes). The push is sent again, the pull resumes."""
    with _relay_behind_forward(tmp_path, "race") as (forward, _relay, client):
        assert client.push(snapshot_blob(model_state(1.0), CHUNK, None), 1, use_shm=False)
        monkeypatch.setattr(datapath, "quiet", lambda sock: True)
        forward.cut()
        with caplog.at_level(logging.INFO, logger="braid.weights.client"):
            assert client.push(snapshot_blob(model_state(2.0), CHUNK, None), 2, use_shm=False)
        assert "was gone" in caplog.text and forward.connections == 2
        forward.cut()
        assert _equal(client.pull(2, allow_shm=False).state, 2.0)
        assert forward.connections == 3 and client.versions().held == [1, 2]
