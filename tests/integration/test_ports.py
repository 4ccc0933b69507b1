"""flows.ports: a supervisor's port held across its server's death, shared by the server's gRPC
listener meanwhile (real sockets, a real in-process gRPC server)."""

from __future__ import annotations

import socket
from concurrent import futures

import grpc
import pytest

from flows.ports import PortReservations

pytestmark = pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="no SO_REUSEPORT on this platform")


def echo_server(port: int) -> grpc.Server:
    """A started echo server on 127.0.0.1:``port`` (gRPC's default options, as Braid's servers)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", {"Echo": handler}),))
    assert server.add_insecure_port(f"127.0.0.1:{port}") == port
    server.start()
    return server


def echoes(port: int) -> bytes:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return channel.unary_unary("/test.Echo/Echo")(b"hi", timeout=10)


def bind_plain(port: int, *, reuseaddr: bool) -> bool:
    """Whether another socket (port 0 binds and outgoing connections set neither option) can bind it."""
    with socket.socket() as s:
        if reuseaddr:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_a_held_port_serves_its_server_stays_held_after_its_death_and_serves_its_restart():
    ports = PortReservations()
    try:
        port = ports.hold("127.0.0.1")
        assert port > 0 and ports.hold("127.0.0.1", port) == port and ports.held() == [("127.0.0.1", port)]
        for _ in range(2):  # the first server, then its restart on the same port
            server = echo_server(port)
            assert echoes(port) == b"hi"
            server.stop(grace=None).wait()
            # dead: nobody else may take it before the restart, with or without SO_REUSEADDR
            assert not bind_plain(port, reuseaddr=False) and not bind_plain(port, reuseaddr=True)
    finally:
        ports.release_all()
    # released: free again (SO_REUSEADDR: the echo connections' TIME_WAIT may linger on it)
    assert ports.held() == [] and bind_plain(port, reuseaddr=True)


def test_a_port_another_process_holds_is_returned_unheld_and_its_server_bind_decides():
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        ports = PortReservations()
        assert ports.hold("127.0.0.1", taken) == taken and ports.held() == []
