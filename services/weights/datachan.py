"""The raw-TCP data channel beside gRPC: one-time tokens, framing, the listening side.

gRPC stays the control plane: ``OpenTransfer`` validates a push's manifest (or resolves a
pull's version), then grants a **token** (16 random bytes) bound to that version and direction,
single use, expiring after ``ttl_s``, and names the data port(s). The bytes then flow over a
plain socket: large ``sendall`` from the version's flat blob, ``recv_into`` straight into the
receiver's preallocated blob at the chunk's place (memoryview slices, no per-chunk protobuf, no
copy in user space), so a transfer costs what a raw ``sendall`` costs plus the chunk digests.

Wire format (all integers big-endian):

- preamble, client -> relay: ``MAGIC`` (4 bytes), direction (1 = push, 2 = pull), version
  (int64), token (16 bytes). A bad, expired, reused or mismatched token: the relay answers a
  status (PERMISSION_DENIED + reason), logs it and closes; nothing held is touched.
- status: code (uint8, a gRPC status code value, 0 = OK), message length (uint32), UTF-8
  message (JSON for a push's final answer). The relay sends one before a pull's chunks and one
  after a push's end frame (or as soon as it refuses a chunk).
- frame: chunk index (uint32), digest length (uint8), digest (``algo:hex``), then the chunk's
  bytes (their length is the manifest's, so it is not sent). ``END`` as the index closes the
  stream; its digest field is the version digest.

Keep-alive: after a transfer that ended cleanly (a push's OK status, a pull's end frame) the
connection waits up to ``KEEPALIVE_S`` for the next preamble (with a new token); the client keeps
such connections (``datapath.KeptConnections``), so consecutive versions over a long link pay
neither the TCP and TLS handshakes nor a fresh congestion window.

With TLS (cross-site links) the relay also listens on a mutual-TLS data port using the site
certificates (``certs.TlsFiles``): a client without a certificate from the site CA is refused in
the handshake. A token granted over a TLS gRPC port is good only on the TLS data port.

``TokenBook`` is pure (injected clock) and unit-tested; ``DataServer`` is the thin socket side.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import ssl
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from services.common.certs import TlsFiles

log = logging.getLogger("braid.weights.data")

MAGIC = b"BRD1"
PUSH, PULL = 1, 2
DIRECTIONS = {"push": PUSH, "pull": PULL}
PREAMBLE = struct.Struct("!4sBq16s")
FRAME = struct.Struct("!IB")
STATUS = struct.Struct("!BI")
END = 0xFFFFFFFF
TOKEN_BYTES = 16
PREAMBLE_TIMEOUT_S = 10.0
IO_TIMEOUT_S = 120.0  # no byte for this long: the peer is gone
KEEPALIVE_S = 60.0  # a connection whose transfer ended cleanly waits this long for the client's next one
MAX_STATUS_BYTES = 1 << 16
# after refusing a push, read at most this much of what is in flight (so the sender sees the status)
DRAIN_BYTES = 256 << 20


class Truncated(ConnectionError):
    """The peer closed the stream in the middle of a frame or before the end frame."""


class TokenRefused(PermissionError):
    pass


@dataclass(frozen=True)
class Grant:
    token: bytes
    version: int
    direction: int
    expires: float
    secure: bool  # granted over TLS: good only on the TLS data port
    payload: object  # the relay's state for this transfer (an Incoming, a chunk range)


class TokenBook:
    """Single-use transfer tokens, bound to version and direction, expiring after ``ttl_s``."""

    def __init__(self, ttl_s: float = 30.0, clock: Callable[[], float] = time.monotonic, remember: int = 4096) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._open: dict[bytes, Grant] = {}
        self._used: OrderedDict[bytes, None] = OrderedDict()  # recently used or expired: "reused", not "unknown"
        self._remember = remember
        self._lock = threading.Lock()

    def issue(self, version: int, direction: int, *, secure: bool = False, payload: object = None) -> Grant:
        with self._lock:
            self._expire()
            grant = Grant(secrets.token_bytes(TOKEN_BYTES), version, direction, self.clock() + self.ttl_s, secure,
                          payload)
            self._open[grant.token] = grant
            return grant

    def take(self, token: bytes, version: int, direction: int, secure: bool) -> Grant:
        """Consume ``token`` for a connection that says (version, direction) on a ``secure`` port;
        ``TokenRefused`` names why not (the token is spent either way once known)."""
        with self._lock:
            grant = self._open.pop(token, None)
            if grant is None:
                raise TokenRefused("token already used" if token in self._used else "unknown token")
            self._forget(token)
            if self.clock() > grant.expires:
                raise TokenRefused("token expired")
            if (grant.version, grant.direction) != (version, direction):
                raise TokenRefused(f"token is for version {grant.version} {_dir(grant.direction)}, "
                                   f"not version {version} {_dir(direction)}")
            if grant.secure and not secure:
                raise TokenRefused("token was granted over TLS: use the TLS data port")
            return grant

    def pending(self) -> list[Grant]:
        with self._lock:
            self._expire()
            return list(self._open.values())

    def _forget(self, token: bytes) -> None:
        self._used[token] = None
        while len(self._used) > self._remember:
            self._used.popitem(last=False)

    def _expire(self) -> None:
        now = self.clock()
        for t in [t for t, g in self._open.items() if now > g.expires]:
            del self._open[t]
            self._forget(t)


def _dir(direction: int) -> str:
    return {PUSH: "push", PULL: "pull"}.get(direction, f"direction {direction}")


# ---------------------------------------------------------------------- framing
def recv_exact_into(sock: socket.socket, view: memoryview) -> None:
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise Truncated(f"stream closed after {got} of {n} bytes")
        got += k


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    recv_exact_into(sock, memoryview(buf))
    return bytes(buf)


def send_frame(sock: socket.socket, index: int, digest: str, data=b"") -> None:
    """Header and bytes in one ``sendmsg`` (no small segment of its own: Nagle and delayed ACKs
    would hold it), looping over partial sends; TLS sockets send the two parts in turn.
    (``os.sendfile`` from the shared-memory blob was tried: slower than this on loopback here.)"""
    d = digest.encode()
    head = FRAME.pack(index, len(d)) + d
    if isinstance(sock, ssl.SSLSocket):
        sock.sendall(head)
        if len(data):
            sock.sendall(data)
        return
    parts = [memoryview(head), memoryview(data).cast("B")] if len(data) else [memoryview(head)]
    while parts:
        sent = sock.sendmsg(parts)
        while parts and sent >= len(parts[0]):
            sent -= len(parts[0])
            parts.pop(0)
        if parts and sent:
            parts[0] = parts[0][sent:]


def read_frame_head(sock: socket.socket) -> tuple[int, str]:
    index, n = FRAME.unpack(recv_exact(sock, FRAME.size))
    return index, recv_exact(sock, n).decode("ascii", "replace") if n else ""


def send_status(sock: socket.socket, code: int, message: str = "") -> None:
    m = message.encode()[:MAX_STATUS_BYTES]
    sock.sendall(STATUS.pack(code, len(m)) + m)


def read_status(sock: socket.socket, prefix: bytes = b"") -> tuple[int, str]:
    """The peer's status; ``prefix``: its first bytes, already read."""
    code, n = STATUS.unpack(prefix + recv_exact(sock, STATUS.size - len(prefix)))
    if n > MAX_STATUS_BYTES:
        raise Truncated(f"status message of {n} bytes")
    return code, recv_exact(sock, n).decode("utf-8", "replace")


# ---------------------------------------------------------------------- TLS
def server_context(tls: TlsFiles) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls.cert, tls.key)
    ctx.load_verify_locations(tls.ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(tls: TlsFiles) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_verify_locations(tls.ca)
    ctx.load_cert_chain(tls.cert, tls.key)
    return ctx


def set_blocking_io(sock: socket.socket, timeout_s: float = IO_TIMEOUT_S) -> None:
    """Blocking mode (one ``send``/``recv`` syscall moves as much as the kernel can: Python's
    own timeouts would poll before every call and return after each socket-buffer-full) with
    the kernel's send/receive timeouts, so a silent peer still ends in ``OSError``."""
    sock.settimeout(None)
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    tv = struct.pack("ll", int(timeout_s), int((timeout_s % 1) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def connect(host: str, port: int, *, tls: TlsFiles | None = None, timeout_s: float = 10.0) -> socket.socket:
    """A data connection (mutual TLS with ``tls``); raises OSError when it cannot be reached."""
    sock = socket.create_connection((host, port), timeout=timeout_s)
    try:
        if tls is not None:
            sock = client_context(tls).wrap_socket(sock, server_hostname=tls.server_name or host)
        set_blocking_io(sock)
    except BaseException:
        sock.close()
        raise
    return sock


def open_stream(sock: socket.socket, direction: int, version: int, token: bytes) -> None:
    sock.sendall(PREAMBLE.pack(MAGIC, direction, version, token))


# ---------------------------------------------------------------------- listening side
Handler = Callable[[Grant, socket.socket], bool]  # True: the transfer ended cleanly, the connection may serve another


class DataServer:
    """Listens on a plaintext data port (and a mutual-TLS one with ``tls``); each connection
    presents a token, then ``handler(grant, sock)`` serves it on its own thread. A transfer that
    ended cleanly leaves the connection open for the client's next one (a new token each time)
    for up to ``keepalive_s``: no new TCP and TLS handshakes, and the congestion window the
    link has earned is kept (a fresh connection over a long fat link starts slow)."""

    def __init__(self, book: TokenBook, handler: Handler, host: str, *, tls: TlsFiles | None = None,
                 tls_host: str | None = None, port: int = 0, tls_port: int = 0,
                 keepalive_s: float = KEEPALIVE_S) -> None:
        self.book = book
        self.keepalive_s = keepalive_s
        self.handler = handler
        self.refused: list[str] = []  # reasons, for tests and logs
        self._closing = threading.Event()
        self._listeners: list[tuple[socket.socket, ssl.SSLContext | None]] = []
        self.port = self._listen(host, port, None)
        self.tls_port = self._listen(tls_host, tls_port, server_context(tls)) if tls is not None and tls_host else 0

    def _listen(self, host: str, port: int, ctx: ssl.SSLContext | None) -> int:
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET, backlog=64)
        self._listeners.append((sock, ctx))
        threading.Thread(target=self._accept, args=(sock, ctx), name="data-accept", daemon=True).start()
        return sock.getsockname()[1]

    def _accept(self, lsock: socket.socket, ctx: ssl.SSLContext | None) -> None:
        while not self._closing.is_set():
            try:
                conn, peer = lsock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn, peer, ctx), name="data-conn", daemon=True).start()

    def _serve(self, conn: socket.socket, peer, ctx: ssl.SSLContext | None) -> None:
        try:
            conn.settimeout(PREAMBLE_TIMEOUT_S)
            if ctx is not None:
                try:
                    conn = ctx.wrap_socket(conn, server_side=True)
                except (ssl.SSLError, OSError) as err:
                    self._refuse(None, peer, f"TLS handshake failed: {err}")
                    return
            kept = False
            while True:  # a kept connection (keep-alive) serves the client's next transfer too
                try:
                    magic, direction, version, token = PREAMBLE.unpack(recv_exact(conn, PREAMBLE.size))
                except (OSError, ValueError) as err:
                    if not kept:  # else: the client closed its kept connection, or let it idle out
                        self._refuse(None, peer, f"no preamble: {err}")
                    return
                if magic != MAGIC:
                    self._refuse(conn, peer, "not a braid data stream")
                    return
                try:
                    grant = self.book.take(token, version, direction, ctx is not None)
                except TokenRefused as err:
                    self._refuse(conn, peer, f"{err} (version {version} {_dir(direction)})")
                    return
                set_blocking_io(conn)
                if not self.handler(grant, conn) or self._closing.is_set():
                    return
                # the grant's payload (an arriving version, with its blob) must not outlive the transfer
                # here: once evicted, its memory would be freed at the start of this connection's next
                # transfer (~0.1 s per 500 MB, with the sender waiting) instead of on the store's reaper
                grant = None
                set_blocking_io(conn, self.keepalive_s)
                kept = True
        except Exception:  # a broken connection must not take the relay down; say what happened
            log.exception("data connection from %s failed", peer)
        finally:
            conn.close()

    def _refuse(self, conn: socket.socket | None, peer, reason: str) -> None:
        self.refused.append(reason)
        log.warning("data connection from %s refused: %s", peer, reason)
        if conn is not None:
            with contextlib.suppress(OSError):
                send_status(conn, 7, reason)  # PERMISSION_DENIED

    def close(self) -> None:
        self._closing.set()
        for sock, _ in self._listeners:
            sock.close()
