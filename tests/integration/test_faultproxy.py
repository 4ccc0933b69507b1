"""The chaos suite's fault-injecting TCP proxy on real loopback sockets (an echo server behind it)."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
import time

import pytest

from services.common.faultproxy import FaultProxy, Faults


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        # the proxy's injected resets reach this end too: an expected end of the connection, not an error
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            while data := self.request.recv(65536):
                self.request.sendall(data)


@pytest.fixture()
def echo():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture()
def proxy(echo):
    p = FaultProxy(echo).start()
    yield p
    p.stop()


def _connect(p: FaultProxy, timeout: float = 10.0) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", p.port), timeout=timeout)
    return s


def _roundtrip(s: socket.socket, payload: bytes) -> bytes:
    s.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def test_forwards_bytes_intact_both_ways(proxy):
    payload = bytes(range(256)) * 4096  # 1 MiB, several chunks
    with _connect(proxy) as s:
        assert _roundtrip(s, payload) == payload
    assert proxy.stats.connections == 1 and proxy.stats.bytes >= 2 * len(payload)


def test_delay_adds_latency_each_way(proxy):
    proxy.set(Faults(delay_ms=100))
    with _connect(proxy) as s:
        t0 = time.monotonic()
        assert _roundtrip(s, b"ping") == b"ping"
        assert time.monotonic() - t0 >= 0.2  # 100 ms up + 100 ms down (a lower bound: steady under load)


def test_reset_gives_the_peer_a_connection_reset(proxy):
    proxy.set(Faults(reset_rate=1.0))
    with _connect(proxy) as s:
        s.sendall(b"x")
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            for _ in range(50):  # the RST may arrive after the first recv returns
                if not s.recv(16):
                    raise ConnectionResetError("closed")
    assert proxy.stats.resets == 1


def test_blackhole_holds_data_until_lifted(proxy):
    with _connect(proxy) as s:
        assert _roundtrip(s, b"a") == b"a"  # at the default 10 s: a busy machine may take a while to echo
        proxy.set(Faults(blackhole=True))
        s.sendall(b"b")
        s.settimeout(0.3)  # held: nothing comes back while the blackhole is on (a wait, not a race)
        with pytest.raises(socket.timeout):
            s.recv(16)
        proxy.set(Faults())
        s.settimeout(10)
        assert s.recv(16) == b"b"
    assert proxy.stats.held_chunks >= 1


def test_refuse_closes_new_connections_and_reset_all_cuts_open_ones(proxy):
    with _connect(proxy) as open_one:
        assert _roundtrip(open_one, b"ok") == b"ok"
        proxy.set(Faults(refuse=True))
        try:  # the reset may reach the client during connect() or at its first read
            with _connect(proxy) as s:
                assert s.recv(16) == b""
        except ConnectionResetError:
            pass
        assert proxy.stats.refused == 1
        proxy.set(Faults())
        assert proxy.reset_all() == 2  # the open pair: client side and upstream side
        with pytest.raises((ConnectionResetError, BrokenPipeError, AssertionError)):
            assert _roundtrip(open_one, b"again") == b"again"


@pytest.mark.parametrize("bad", [dict(delay_ms=-1), dict(reset_rate=2.0)])
def test_bad_faults_are_refused(bad):
    with pytest.raises(ValueError):
        Faults(**bad)
    with pytest.raises(ValueError, match="host:port"):
        FaultProxy("nohostport")
