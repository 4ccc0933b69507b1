"""services.common.rpc (servers, ports, channels) and services.common.entry (what every service
process shares: flags, port file, serving until a signal), against a real in-process server."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from pathlib import Path

import grpc
import pytest

from services.common.certs import make_ca, make_site_cert
from services.common.entry import add_serve_args, check_port, publish_port, serve_until_signal
from services.common.rpc import bind, connect, message_options, new_server

ECHO = "/test.Echo/Echo"
LIMIT = 64 * 1024


@pytest.fixture
def echo_server():
    """An unstarted echo server (bytes in, bytes out) with LIMIT-byte messages; stopped after."""
    server = new_server(workers=2, thread_name_prefix="test-rpc", max_message_bytes=LIMIT)
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", {"Echo": handler}),))
    yield server
    server.stop(grace=None)


def test_message_options_cap_both_directions():
    assert dict(message_options(5)) == {"grpc.max_receive_message_length": 5, "grpc.max_send_message_length": 5}


def test_port_zero_binds_a_free_port_that_serves(echo_server):
    port = bind(echo_server, "127.0.0.1:0")
    assert 0 < port < 65536
    echo_server.start()
    with connect(f"127.0.0.1:{port}", max_message_bytes=4 * LIMIT) as channel:
        assert channel.unary_unary(ECHO)(b"hello", timeout=10) == b"hello"
        with pytest.raises(grpc.RpcError) as err:  # the server's cap holds whatever the client allows
            channel.unary_unary(ECHO)(b"x" * (2 * LIMIT), timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_malformed_requests_are_invalid_argument(echo_server):
    def strict(data: bytes) -> bytes:
        raise ValueError("not mine")

    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: request, request_deserializer=strict)
    echo_server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Strict", {"Call": handler}),))
    port = bind(echo_server, "127.0.0.1:0")
    echo_server.start()
    with connect(f"127.0.0.1:{port}", max_message_bytes=LIMIT) as channel, pytest.raises(grpc.RpcError) as err:
        channel.unary_unary("/test.Strict/Call")(b"x", timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not mine" in err.value.details()


def test_an_unbindable_address_raises(echo_server):
    with pytest.raises(RuntimeError, match="bind"):
        bind(echo_server, "256.1.1.1:0")


def test_a_tls_port_serves_mutual_tls_only(echo_server, tmp_path: Path):
    ca_cert, ca_key = make_ca(tmp_path)
    files = make_site_cert(tmp_path, "site-a", [], ca_cert, ca_key)
    plain, secure = bind(echo_server, "127.0.0.1:0"), bind(echo_server, "127.0.0.1:0", files, label=" (TLS)")
    assert plain != secure
    echo_server.start()
    with connect(f"127.0.0.1:{secure}", max_message_bytes=LIMIT, tls=files) as channel:
        assert channel.unary_unary(ECHO)(b"over tls", timeout=10) == b"over tls"
    with connect(f"127.0.0.1:{secure}", max_message_bytes=LIMIT) as channel, pytest.raises(grpc.RpcError) as err:
        channel.unary_unary(ECHO)(b"plaintext", timeout=5)
    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_serve_args_and_port_check():
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    ns = parser.parse_args([])
    assert (ns.host, ns.port, ns.port_file) == ("127.0.0.1", 0, None)
    check_port(parser, 65535)
    with pytest.raises(SystemExit) as exit_:
        check_port(parser, 70000, "--data-port")
    assert exit_.value.code == 2


def test_publish_port_writes_the_port_and_the_tls_port(tmp_path: Path):
    publish_port(None, 1)  # no file: nothing
    publish_port(tmp_path / "a.port", 4321)
    publish_port(str(tmp_path / "b.port"), 4321, 4322)
    assert (tmp_path / "a.port").read_text() == "4321"
    assert (tmp_path / "b.port").read_text().split() == ["4321", "4322"]
    assert sorted(os.listdir(tmp_path)) == ["a.port", "b.port"]


@pytest.fixture
def restore_signals():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.mark.usefixtures("restore_signals")
def test_serving_ends_with_the_checks_exit_code():
    calls = []

    def check() -> int | None:
        calls.append(1)
        return 3 if len(calls) == 2 else None

    assert serve_until_signal(0.01, check) == 3
    assert len(calls) == 2


@pytest.mark.usefixtures("restore_signals")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serving_ends_on_sigterm_and_sigint(signum):
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signum))
    timer.start()
    assert serve_until_signal(0.05) is None
    timer.join()
