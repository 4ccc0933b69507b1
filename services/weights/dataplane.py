"""The relay's side of the raw-TCP data channel: open a transfer (gRPC), serve its bytes (socket).

``open`` runs inside the ``OpenTransfer`` RPC: a push's manifest goes through the same checks
as a gRPC ``Push`` (``VersionStore.begin``: fingerprint, older version, already held, layout)
and its ``Incoming`` is created (forwarders start, exactly as for a gRPC push); a pull's
version is resolved (waiting up to ``wait_s``; NOT_FOUND names the versions held) and its chunk
digests go back in the grant. Then a one-time token (``datachan.TokenBook``) is granted.

``serve`` runs on the data connection that presented the token:

- push: frames are received straight into the arriving version's blob at each chunk's place
  (``VersionStore.receive``: index in range, strictly increasing, chunk digest checked before
  the chunk counts); the end frame carries the version digest and the version is committed only
  if every chunk is in and the version digest matches (a torn version is never visible). The
  final status is JSON ``{"committed", "chunks", "bytes"}``. A refused chunk answers its status at
  once (the sender checks for it between chunks) and drops the arriving version if no other
  stream writes it; a stream that merely broke keeps it for a resume (the next grant's
  ``from_chunk``).
- pull: the version is pinned (eviction cannot pull it away), an OK status, then a frame per
  chunk ``sendall`` from the blob itself, then the end frame with the version digest.

Fault hooks (the servicer's ``BRAID_RELAY_FAULTS``): ``corrupt`` flips one byte of a chunk the
first time it is served, as on the gRPC path; ``truncate`` cuts the next pull after N chunks.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable

import grpc

from services.common.certs import TlsFiles
from services.common.weights import WeightError
from services.proto import braid_pb2 as pb
from services.weights import datachan as dc
from services.weights.convert import delta_base, delta_fields, manifest_from_pb, manifest_to_pb
from services.weights.store import Incoming, Stored, VersionStore, wait_limit
from services.weights.wire import WEIGHT_ERROR_CODES

log = logging.getLogger("braid.relay.data")

CODES = WEIGHT_ERROR_CODES
MAX_WAIT_S = 600.0


def code_value(code: grpc.StatusCode) -> int:
    return code.value[0]


class RelayDataPlane:
    def __init__(
        self, store: VersionStore, host: str, *, on_begin: Callable[[Incoming], None],
        on_commit: Callable[[Incoming], bool], corrupt: set[int], truncate: list[int] | None = None,
        source: Callable[[Stored, int, str], Stored] | None = None,
        tls: TlsFiles | None = None, tls_host: str | None = None, ttl_s: float = 30.0, port: int = 0,
        tls_port: int = 0, advertise: tuple[int, int] = (0, 0),
    ) -> None:
        self.store = store
        self.on_begin = on_begin
        self.on_commit = on_commit
        # what a pull holding a version gets (``DeltaLog.for_puller``): a delta, or the version whole
        self.source = source or (lambda full, have_version, have_digest: full.source(have_version, have_digest))
        self.corrupt = corrupt
        self.truncate = truncate if truncate is not None else []  # test hook: cut the next pull after N chunks
        self.book = dc.TokenBook(ttl_s)
        self.server = dc.DataServer(self.book, self.serve, host, tls=tls, tls_host=tls_host, port=port,
                                    tls_port=tls_port)
        # the ports named in grants: the bound ones unless a NAT, port forward or proxy sits in front
        self.ports = (advertise[0] or self.server.port, advertise[1] or self.server.tls_port)

    # ------------------------------------------------------------------ control (gRPC)
    def open(self, req: pb.TransferRequest, secure: bool, wait_s: float | None = None) -> pb.TransferGrant:
        """Check and open a transfer; raises ``WeightError`` (the caller aborts with its code).
        ``wait_s``: how long a pull may wait for its version (default: ``req.wait_s``, clamped)."""
        direction = dc.DIRECTIONS.get(req.direction)
        if direction is None:
            raise WeightError("argument", f"direction {req.direction!r} is not 'push' or 'pull'")
        if direction == dc.PUSH:
            if not req.HasField("manifest"):
                raise WeightError("argument", "a push transfer needs the manifest")
            manifest = manifest_from_pb(req.manifest)
            inc = self.store.begin(req.manifest.version, manifest, delta_base=delta_base(req.manifest))
            self.on_begin(inc)
            g = self.book.issue(inc.version, dc.PUSH, secure=secure, payload=inc)
            return self._grant(g, from_chunk=inc.prefix)
        with self.store.pinned(req.version, wait_limit(req.wait_s, MAX_WAIT_S) if wait_s is None else wait_s) as full:
            s = self.source(full, req.have_version, req.have_digest) if req.delta_ok else full
            n = len(s.manifest.plan)
            stop = req.to_chunk or n
            if not req.from_chunk <= stop <= n:
                raise WeightError("argument", f"chunk range [{req.from_chunk}, {stop}) outside 0..{n}")
            head = manifest_to_pb(s.manifest, s.version, version_digest=s.digest, chunk_digests=list(s.digests),
                                  **delta_fields(s, full))
            g = self.book.issue(s.version, dc.PULL, secure=secure, payload=(req.from_chunk, stop, s))
        return self._grant(g, manifest=head)

    def _grant(self, g: dc.Grant, **extra) -> pb.TransferGrant:
        return pb.TransferGrant(token=g.token, port=self.ports[0], tls_port=self.ports[1],
                                ttl_s=self.book.ttl_s, version=g.version, **extra)

    # ------------------------------------------------------------------ data (socket)
    def serve(self, grant: dc.Grant, sock: socket.socket) -> bool:
        """Serve one transfer; True when it ended cleanly (the connection may carry another)."""
        if grant.direction == dc.PUSH:
            return self._serve_push(grant.payload, sock)  # type: ignore[arg-type]
        return self._serve_pull(grant.version, *grant.payload, sock)  # type: ignore[misc]

    def _serve_push(self, inc: Incoming, sock: socket.socket) -> bool:
        self.store.attach(inc)
        attached, refused, chunks, nbytes, last = True, True, 0, 0, -1
        try:
            while True:
                index, digest = dc.read_frame_head(sock)
                if index == dc.END:
                    self.store.set_digest(inc, digest)
                    break

                def fill(view, _sock=sock) -> None:
                    dc.recv_exact_into(_sock, view)

                if self.store.receive(inc, index, digest, last, fill):
                    chunks += 1
                    nbytes += inc.manifest.plan[index].length
                last = index
            committed = self.on_commit(inc)
            refused = attached = False
            self.store.detach(inc, False)
            dc.send_status(sock, 0, json.dumps({"committed": committed, "chunks": chunks, "bytes": nbytes}))
            return True
        except WeightError as err:
            if err.kind == "integrity" and "version digest" in str(err):
                self.store.discard(inc)  # an inconsistent set of chunks: nothing of it is kept
            self.store.detach(inc, True)  # before answering: the sender may look right after
            attached = False
            log.warning("data push of version %d refused: %s", inc.version, err)
            self._answer_refusal(sock, CODES[err.kind], str(err))
        except OSError as err:  # the sender went away: keep what arrived for a resume
            refused = False
            log.warning("data push of version %d broke after %d chunks: %s", inc.version, chunks, err)
        finally:
            if attached:
                self.store.detach(inc, refused)
        return False

    @staticmethod
    def _answer_refusal(sock: socket.socket, code: grpc.StatusCode, message: str) -> None:
        """Send the refusal, then read (and drop) what the sender still has in flight until it
        closes, so it reads the status instead of a reset."""
        try:
            dc.send_status(sock, code_value(code), message)
            dc.set_blocking_io(sock, 5.0)
            scratch, drained = bytearray(1 << 20), 0
            while drained < dc.DRAIN_BYTES:
                k = sock.recv_into(scratch)
                if k == 0:
                    break
                drained += k
        except OSError:
            pass

    def _serve_pull(self, version: int, start: int, stop: int, src: Stored, sock: socket.socket) -> bool:
        """Send chunks [start, stop) of ``src``: the version, or the delta to it the grant named (the
        version stays pinned meanwhile; committed bytes never change)."""
        try:
            with self.store.pinned(version):
                s = src
                dc.send_status(sock, 0)
                cut = self.truncate.pop() if self.truncate else None
                for k, ref in enumerate(s.manifest.plan[start:stop]):
                    if k == cut:
                        log.warning("test hook: cutting the pull of version %d after %d chunks", version, k)
                        return False
                    data = s.blob.view[ref.blob_offset : ref.blob_offset + ref.length]
                    if ref.index in self.corrupt:
                        self.corrupt.discard(ref.index)
                        data = bytes([data[0] ^ 0xFF]) + bytes(data[1:])
                    dc.send_frame(sock, ref.index, s.digests[ref.index], data)
                dc.send_frame(sock, dc.END, s.digest)
            return True
        except WeightError as err:
            dc.send_status(sock, code_value(CODES[err.kind]), str(err))
        except OSError as err:
            log.warning("data pull of version %d broke: %s", version, err)
        return False

    def close(self) -> None:
        self.server.close()
