"""The client's side of the raw-TCP data channel (``datachan``): push and pull a version's bytes.

``send_version`` pushes frames (chunk index, digest, the blob slice itself: one ``sendall`` per
chunk, no copy) after the token preamble, from the chunk the relay says it already holds in a
row (resume), and checks between chunks whether the relay has refused the stream (its status is
then read and raised). ``receive_version`` reads frames straight into the caller's
preallocated buffer (``recv_into`` at each chunk's place), checks every chunk's digest against
the grant's list and its bytes, and reports which chunks arrived and which were corrupted; the
caller re-fetches the corrupted ones and resumes a truncated stream from the first missing chunk.

Errors: a refusal is ``RelayError`` with the relay's status code; a broken connection is
``RelayError(UNAVAILABLE)`` (the same retry rules as gRPC); ``DataChannelUnreachable`` means
the data port could not be reached at all (the client falls back to gRPC streaming).
"""

from __future__ import annotations

import json
import mmap
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from services.common.certs import TlsFiles
from services.common.weights import Manifest, WeightError, check_chunk_digest, chunk_digest, version_digest
from services.weights import datachan as dc
from services.weights.values import RelayError

_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}
Frames = Iterator[tuple[int, str, object]]  # (chunk index or END, digest, bytes)


class DataChannelUnreachable(ConnectionError):
    pass


def _relay_error(code: int, message: str):
    return RelayError(_BY_VALUE.get(code, grpc.StatusCode.UNKNOWN), message)


def _broken(err: BaseException, what: str):
    return RelayError(grpc.StatusCode.UNAVAILABLE, f"data channel broke during {what}: {err}")


def private_buffer(size: int, populate: bool = False) -> mmap.mmap:
    """A receive buffer: private anonymous memory (cheaper page faults than the shared kind);
    ``populate``: fault every page in now. ``BRAID_HUGEPAGES=1`` asks for transparent huge pages
    (slower here: the kernel compacts memory to find them)."""
    buf = mmap.mmap(-1, max(size, 1),
                    flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (mmap.MAP_POPULATE if populate else 0))
    if os.environ.get("BRAID_HUGEPAGES") and hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    return buf


def dial(host: str, port: int, tls: TlsFiles | None, direction: int, version: int, token: bytes) -> socket.socket:
    if port == 0:
        raise DataChannelUnreachable("the relay has no data port for this link (no TLS data port)")
    try:
        sock = dc.connect(host, port, tls=tls)
    except OSError as err:
        raise DataChannelUnreachable(f"data channel at {host}:{port} unreachable: {err}") from err
    try:
        dc.open_stream(sock, direction, version, token)
    except OSError as err:
        sock.close()
        raise DataChannelUnreachable(f"data channel at {host}:{port} closed at once: {err}") from err
    return sock


class KeptConnections:
    """Data connections whose transfer ended cleanly, kept per data port for the next transfer
    (the relay waits ``datachan.KEEPALIVE_S`` for it; the client lets one go after half that,
    and checks it is still open before use). Thread-safe: each transfer takes its own."""

    def __init__(self, max_per_port: int = 4, idle_s: float = dc.KEEPALIVE_S / 2,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_per_port, self.idle_s, self._clock = max_per_port, idle_s, clock
        self._lock = threading.Lock()
        self._kept: dict[int, list[tuple[float, socket.socket]]] = {}
        self.reused = 0  # transfers that ran on a kept connection

    def dial(self, host: str, port: int, tls: TlsFiles | None, direction: int, version: int,
             token: bytes) -> tuple[socket.socket, bool]:
        """(a kept connection to ``port`` with the new preamble sent, True), else (a fresh one,
        False). A kept one can still turn out closed (the relay restarted just now): the caller
        retries such a transfer once on a fresh connection."""
        while (sock := self._take(port)) is not None:
            try:
                dc.open_stream(sock, direction, version, token)
                self.reused += 1
                return sock, True
            except OSError:
                sock.close()
        return dial(host, port, tls, direction, version, token), False

    def give(self, port: int, sock: socket.socket) -> None:
        with self._lock:
            kept = self._kept.setdefault(port, [])
            if len(kept) < self.max_per_port:
                kept.append((self._clock(), sock))
                return
        sock.close()

    def _take(self, port: int) -> socket.socket | None:
        while True:
            with self._lock:
                kept = self._kept.get(port)
                if not kept:
                    return None
                since, sock = kept.pop()
            if self._clock() - since < self.idle_s and quiet(sock):
                return sock
            sock.close()

    def close(self) -> None:
        with self._lock:
            kept, self._kept = self._kept, {}
        for socks in kept.values():
            for _, sock in socks:
                sock.close()


def _first_unread_byte(sock: socket.socket) -> bytes | None:
    """Without blocking: None when there is nothing to read, else the first unread byte (b"" at
    EOF). A TLS socket can be readable with TLS records only (TLS 1.3 session tickets): that is
    nothing to read too (a blocking read would wait for bytes never sent)."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return None
    if not isinstance(sock, ssl.SSLSocket):
        return sock.recv(1)
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        return sock.recv(1)
    except ssl.SSLWantReadError:
        return None
    finally:
        sock.settimeout(timeout)


def _refused_early(sock: socket.socket) -> None:
    """Raise the relay's status if it has already answered (it refused a chunk)."""
    prefix = _first_unread_byte(sock)
    if prefix is not None:
        code, message = dc.read_status(sock, prefix)
        raise _relay_error(code, message)


def quiet(sock: socket.socket) -> bool:
    """A kept data connection is fit for another transfer: still open, nothing unread (a closed
    one reads as EOF; bytes nobody asked for make it unfit too)."""
    try:
        return _first_unread_byte(sock) is None
    except (OSError, ValueError):
        return False


def send_version(sock: socket.socket, frames: Frames) -> dict:
    """Send every frame (the last is ``END`` with the version digest); return the relay's answer.
    The socket stays open when the relay accepted the version (the caller keeps it for the next
    transfer or closes it) and is closed otherwise."""
    ok = False
    try:
        index = None
        try:
            for index, digest, data in frames:
                _refused_early(sock)
                dc.send_frame(sock, index, digest, data)
        except (BrokenPipeError, ConnectionResetError):
            index = dc.END  # the relay refused and closed: its status says why
        if index != dc.END:
            raise _relay_error(grpc.StatusCode.INTERNAL.value[0], "push frames ended without the end frame")
        code, message = dc.read_status(sock)
        if code != 0:
            raise _relay_error(code, message)
        ok = True
        return json.loads(message)
    except OSError as err:
        raise _broken(err, "a push") from err
    finally:
        if not ok:
            sock.close()


class LazyDigests:
    """A version's chunk digests, each computed when first asked for (``given``: known already)."""

    def __init__(self, manifest: Manifest, view, algo: str, given: list[str] | None = None) -> None:
        self.manifest, self.view, self.algo = manifest, view, algo
        self._d: list[str | None] = list(given) if given is not None else [None] * len(manifest.plan)

    def __getitem__(self, index: int) -> str:
        d = self._d[index]
        if d is None:
            ref = self.manifest.plan[index]
            d = self._d[index] = chunk_digest(self.view[ref.blob_offset : ref.blob_offset + ref.length], self.algo)
        return d

    def all(self) -> list[str]:
        return [self[i] for i in range(len(self._d))]

    def version(self) -> str:
        return version_digest(self.all())


def blob_frames(manifest: Manifest, view, digests: LazyDigests, start: int) -> Frames:
    for ref in manifest.plan[start:]:
        yield ref.index, digests[ref.index], view[ref.blob_offset : ref.blob_offset + ref.length]
    yield dc.END, digests.version(), b""


def receive_version(
    sock: socket.socket, manifest: Manifest, view, digests: list[str], vdigest: str, start: int, stop: int,
    got: list[bool], bad: list[int],
) -> None:
    """Read chunks ``start..stop-1`` into ``view``; mark ``got[i]`` or add ``i`` to ``bad``.
    A truncated stream raises ``RelayError(UNAVAILABLE)`` after marking what did arrive. The
    socket stays open after a complete stream (for the caller to keep), else it is closed."""
    plan, last, ok = manifest.plan, start - 1, False
    try:
        code, message = dc.read_status(sock)
        if code != 0:
            raise _relay_error(code, message)
        while True:
            index, digest = dc.read_frame_head(sock)
            if index == dc.END:
                if digest != vdigest:
                    raise WeightError("integrity", "the relay's end frame carries another version digest")
                break
            if not last < index < stop:
                raise WeightError("argument", f"relay sent chunk {index} after {last} (range {start}..{stop - 1})")
            if digest != digests[index]:
                raise WeightError("integrity", f"relay sent chunk {index} with another digest than granted")
            ref = plan[index]
            place = view[ref.blob_offset : ref.blob_offset + ref.length]
            dc.recv_exact_into(sock, place)
            last = index
            if check_chunk_digest(place, digest):
                got[index] = True
            else:
                bad.append(index)
        if last != stop - 1:
            raise WeightError("argument", f"pull stream ended at chunk {last}, expected {stop - 1}")
        ok = True
    except OSError as err:
        raise _broken(err, "a pull") from err
    finally:
        if not ok:
            sock.close()


def first_missing(got: list[bool], start: int = 0) -> int:
    return next((i for i in range(start, len(got)) if not got[i]), len(got))

