"""The data channel's token book (pure, injected clock) and frame helpers over a socket pair."""

from __future__ import annotations

import socket

import pytest

from services.weights import datachan as dc


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_token_is_single_use_and_bound_to_version_and_direction():
    book = dc.TokenBook(ttl_s=5.0, clock=Clock())
    g = book.issue(3, dc.PULL, payload="range")
    assert len(g.token) == dc.TOKEN_BYTES
    assert book.take(g.token, 3, dc.PULL, secure=False).payload == "range"
    with pytest.raises(dc.TokenRefused, match="already used"):
        book.take(g.token, 3, dc.PULL, secure=False)
    with pytest.raises(dc.TokenRefused, match="unknown token"):
        book.take(b"x" * dc.TOKEN_BYTES, 3, dc.PULL, secure=False)
    g = book.issue(3, dc.PULL)
    with pytest.raises(dc.TokenRefused, match="for version 3 pull, not version 3 push"):
        book.take(g.token, 3, dc.PUSH, secure=False)
    with pytest.raises(dc.TokenRefused, match="already used"):  # a refused token is spent too
        book.take(g.token, 3, dc.PULL, secure=False)
    g = book.issue(4, dc.PUSH)
    with pytest.raises(dc.TokenRefused, match="for version 4 push, not version 5 push"):
        book.take(g.token, 5, dc.PUSH, secure=False)


def test_tokens_expire_and_tls_tokens_need_the_tls_port():
    clock = Clock()
    book = dc.TokenBook(ttl_s=5.0, clock=clock)
    g = book.issue(1, dc.PUSH)
    clock.t += 5.1
    with pytest.raises(dc.TokenRefused, match="expired"):
        book.take(g.token, 1, dc.PUSH, secure=False)
    g = book.issue(1, dc.PUSH)
    clock.t += 6.0
    assert book.pending() == []  # expired grants are dropped (and then count as used)
    with pytest.raises(dc.TokenRefused, match="already used"):
        book.take(g.token, 1, dc.PUSH, secure=False)
    g = book.issue(1, dc.PULL, secure=True)
    with pytest.raises(dc.TokenRefused, match="granted over TLS"):
        book.take(g.token, 1, dc.PULL, secure=False)
    g = book.issue(1, dc.PULL, secure=True)
    assert book.take(g.token, 1, dc.PULL, secure=True).version == 1


def test_frames_and_status_round_trip_and_truncation_is_detected():
    a, b = socket.socketpair()
    with a, b:
        data = bytes(range(256)) * 64
        dc.send_frame(a, 7, "xxh3_128:abc", memoryview(data))
        dc.send_frame(a, dc.END, "sha256:00")
        dc.send_status(a, 5, "version 9 is not held")
        index, digest = dc.read_frame_head(b)
        buf = bytearray(len(data))
        dc.recv_exact_into(b, memoryview(buf))
        assert (index, digest, bytes(buf)) == (7, "xxh3_128:abc", data)
        assert dc.read_frame_head(b) == (dc.END, "sha256:00")
        assert dc.read_status(b) == (5, "version 9 is not held")
        dc.send_frame(a, 1, "d", b"12345")
        a.shutdown(socket.SHUT_WR)
        assert dc.read_frame_head(b) == (1, "d")
        with pytest.raises(dc.Truncated):
            dc.recv_exact_into(b, memoryview(bytearray(10)))


def test_kept_connections_are_bounded_expire_and_are_checked_before_use():
    from services.weights.datapath import KeptConnections

    clock = Clock()
    kept = KeptConnections(max_per_port=2, idle_s=30.0, clock=clock)
    pairs = [socket.socketpair() for _ in range(3)]
    try:
        for a, _ in pairs:
            kept.give(7000, a)
        assert pairs[2][0].fileno() == -1  # over the bound: closed at once
        assert kept._take(7001) is None  # another port
        assert kept._take(7000) is pairs[1][0]  # the newest first
        pairs[0][1].close()  # the relay closed the older one
        assert kept._take(7000) is None and pairs[0][0].fileno() == -1
        a, b = socket.socketpair()
        kept.give(7000, a)
        clock.t += 31.0
        assert kept._take(7000) is None and a.fileno() == -1  # idle too long: let go
        b.close()
        c, d = socket.socketpair()
        kept.give(7000, c)
        d.sendall(b"?")  # bytes nobody asked for: not fit for a transfer
        assert kept._take(7000) is None
        d.close()
    finally:
        kept.close()
        for a, b in pairs:
            a.close()
            b.close()


def test_a_kept_connection_does_not_hold_its_last_transfer_payload():
    """A kept connection must let its finished transfer's payload (an arriving version and its
    blob) go: the relay frees an evicted version on its reaper, not when the connection's next
    transfer starts."""
    import threading
    import weakref

    class Payload:
        pass

    book = dc.TokenBook(ttl_s=30)
    served = threading.Event()

    def handler(grant: dc.Grant, sock: socket.socket) -> bool:
        served.set()
        return True  # clean end: the connection is kept for the next transfer

    server = dc.DataServer(book, handler, "127.0.0.1")
    payload = Payload()
    gone = weakref.ref(payload)
    grant = book.issue(3, dc.PUSH, payload=payload)
    del payload
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        dc.open_stream(sock, dc.PUSH, 3, grant.token)
        del grant
        assert served.wait(5)
        for _ in range(100):  # the serving thread drops it right after the handler returns
            if gone() is None:
                break
            threading.Event().wait(0.02)
        assert gone() is None  # while the connection is still open and kept
    server.close()
