"""Client of a weight relay: push a version, pull one, read progress; speaks dataclasses.

Transfer paths, fastest first:

- **same host, shared memory** (Laminar's PCIe analogue): when the relay reports our host id
  and the blob lives in ``/dev/shm``, a push hands over the file (``shm_path``: the relay
  checks every chunk digest and adopts it, no copy) and a pull maps the relay's file
  read-only and checks the digests; tensors view the mapping (no copy until the engine loads
  them).
- **network, raw-TCP data channel** (``data_path="tcp"``, the default): ``OpenTransfer`` (gRPC)
  grants a one-time token, then the bytes flow over a plain socket straight between the blobs
  (``datachan``, ``datapath``); a truncated pull resumes from the first missing chunk. If the
  data port cannot be reached, the client says so in the log and streams over gRPC instead.
- **network, gRPC streams** (``data_path="grpc"``): ``streams`` parallel streams over disjoint
  chunk sets (``index % parts``).

Either way each chunk is checked against its digest on arrival, a corrupted chunk is re-fetched
alone (``from_chunk``/``to_chunk``), and the version digest is checked over all chunk digests.

Every call has a deadline; ``RelayError`` carries the status code and the relay's message. The
pulls are ``services.weights.pull.PullSide``, which ``RelayClient`` extends.
"""

from __future__ import annotations

import logging
import mmap
import time
from collections.abc import Iterator

import grpc

from services.common.certs import TlsFiles
from services.common.rpc import connect
from services.common.weights import (
    Manifest,
    blob_chunk,
)
from services.proto import braid_pb2 as pb
from services.proto import braid_pb2_grpc as pb_grpc
from services.weights import datachan as dc
from services.weights import datapath
from services.weights.blob import host_id
from services.weights.convert import manifest_to_pb
from services.weights.pull import PullSide, run_parts
from services.weights.values import (
    Pulled,
    RelayError,
    RelayInfo,
    VersionState,
    WeightBlob,
    _info,
    snapshot_blob,
)
from services.weights.wire import encode_chunk, pull_callable, push_callable

__all__ = ["Pulled", "RelayClient", "RelayError", "RelayInfo", "VersionState", "WeightBlob", "snapshot_blob"]

log = logging.getLogger("braid.weights.client")
DATA_PATHS = ("tcp", "grpc")
DATA_RETRY_S = 60.0  # after the data channel was unreachable, use gRPC streams this long
CONTROL_TIMEOUT_S = 10.0
_NONE = VersionState(-1, False, 0, 0, 0, "", 0.0)  # a version the relay does not list


def _channel(address: str, tls: TlsFiles | None, limit: int) -> grpc.Channel:
    # a restarted relay must be seen again within a heartbeat or two, not after gRPC's 1-120 s backoff
    backoff = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
               ("grpc.max_reconnect_backoff_ms", 1000)]
    return connect(address, max_message_bytes=limit, tls=tls, options=backoff)


class RelayClient(PullSide):
    """A relay's client: control calls and pushes here, pulls in ``PullSide`` (``services.weights.pull``)."""

    def __init__(
        self, address: str, *, tls: TlsFiles | None = None, max_message_mb: int = 256, timeout_s: float = 600.0,
        data_path: str = "tcp",
    ) -> None:
        if data_path not in DATA_PATHS:
            raise ValueError(f"data_path {data_path!r} is not one of {DATA_PATHS}")
        self.address = address
        self.data_path = data_path
        self._tls = tls
        self._data_host = address.rsplit(":", 1)[0].strip("[]")
        self.timeout_s = timeout_s
        self._channel = _channel(address, tls, max_message_mb * 1024 * 1024)
        self._stub = pb_grpc.WeightRelayStub(self._channel)
        self._push = push_callable(self._channel)
        self._pull = pull_callable(self._channel)
        self._host = host_id()
        self._spare_buf: mmap.mmap | None = None
        self._data_down_until = 0.0
        self.kept = datapath.KeptConnections()  # data connections kept for the next transfer

    def reserve(self, nbytes: int) -> None:
        """Pre-fault a receive buffer of ``nbytes`` for the next data-channel pull of that size
        (its pages then cost nothing during ``recv_into``). The pull takes it over: the caller
        reserves again once it no longer uses the previous version's tensors."""
        self._spare_buf = datapath.private_buffer(nbytes, populate=True)

    def close(self) -> None:
        self.kept.close()
        self._channel.close()

    # ------------------------------------------------------------------ control
    def versions(self, timeout_s: float = CONTROL_TIMEOUT_S) -> RelayInfo:
        return _info(self._stub.Versions(pb.VersionsRequest(), timeout=timeout_s))

    def heartbeat(self, caller: str, timeout_s: float) -> RelayInfo:
        return _info(self._stub.Heartbeat(pb.HeartbeatRequest(caller=caller), timeout=timeout_s))

    def set_chain(self, epoch: int, branches: list[list[str]], upstream: str = "") -> int:
        """Send a plan; returns the relay's epoch after it (newer than ``epoch``: the plan was ignored)."""
        req = pb.ChainRequest(epoch=epoch, branches=[pb.Branch(relays=b) for b in branches], upstream=upstream)
        return int(self._stub.SetChain(req, timeout=CONTROL_TIMEOUT_S).epoch)

    def wait_ready(self, timeout_s: float = 60.0) -> RelayInfo:
        import time

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.versions(timeout_s=2.0)
            except grpc.RpcError as err:
                if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    # ------------------------------------------------------------------ push
    def push(
        self, wb: WeightBlob, version: int, *, streams: int = 1, use_shm: bool = True, algo: str = "xxh3_128",
        from_chunk: int = 0, sender: str = "trainer", digests: list[str] | None = None, delta_base: int | None = None,
    ) -> bool:
        """Push one version (``delta_base``: ``wb`` is the delta from that version, ``delta_blob``);
        returns True when the relay reports it committed."""
        m = wb.manifest
        delta = {} if delta_base is None else {"delta": True, "delta_base": delta_base}
        lazy = datapath.LazyDigests(m, wb.blob.view, algo, digests)

        def frames(start: int):  # chunk digests computed as the chunks go (hashing overlaps the transfer)
            return datapath.blob_frames(m, wb.blob.view, lazy, start)

        if use_shm and wb.blob.path is not None and from_chunk == 0 and self._same_host():
            digests, vdigest = lazy.all(), lazy.version()
            msg = pb.PushMessage(
                manifest=manifest_to_pb(m, version, chunk_digests=digests, shm_path=str(wb.blob.path),
                                        host_id=self._host, **delta),
                parts=1, version_digest=vdigest, sender=sender,
            )
            try:
                return self._call_push(iter([msg])).committed
            except RelayError as err:
                if err.code != grpc.StatusCode.FAILED_PRECONDITION or "shared memory" not in str(err):
                    raise  # the relay cannot adopt files (no shared memory there): stream instead
        if self.data_path == "tcp":  # the grant says where to resume (what the relay holds in a row)
            try:
                committed = self.try_data_channel(self.push_data, m, version, frames, sender, delta)
            except RelayError as err:
                if err.code == grpc.StatusCode.ALREADY_EXISTS and "already held" in str(err):
                    return True  # a re-push after a failover: the new master has it already
                raise
            if committed is not None:
                return committed or self.versions().versions.get(version, _NONE).complete
        if from_chunk == 0:  # resume what this relay already holds of it (a re-push after a failover)
            try:
                held = self.versions().versions.get(version)
            except grpc.RpcError as err:
                raise RelayError(err.code(), err.details() or "") from err
            if held is not None and held.complete:
                return True
            from_chunk = held.received if held is not None else 0
        digests, vdigest = lazy.all(), lazy.version()
        parts = max(1, min(streams, len(m.plan) - from_chunk))
        acks = run_parts(parts, lambda part: self._call_push(
            self._push_messages(wb, version, digests, vdigest, part, parts, from_chunk, sender, delta)))
        return any(a.committed for a in acks) or self.versions().versions.get(version, _NONE).complete

    def _push_messages(
        self, wb, version, digests, vdigest, part, parts, from_chunk, sender, delta
    ) -> Iterator[pb.PushMessage]:
        yield pb.PushMessage(manifest=manifest_to_pb(wb.manifest, version, **delta), part=part, parts=parts,
                             sender=sender)
        for ref in wb.manifest.plan[from_chunk:]:
            if ref.index % parts == part:
                chunk = blob_chunk(wb.manifest, wb.blob.view, ref, version, digests[ref.index])
                yield encode_chunk(chunk, chunk.data)
        yield pb.PushMessage(version_digest=vdigest)

    # ------------------------------------------------------------------ data channel
    def open_transfer(self, request: pb.TransferRequest) -> pb.TransferGrant:
        try:
            return self._stub.OpenTransfer(request, timeout=CONTROL_TIMEOUT_S + request.wait_s)
        except grpc.RpcError as err:
            raise RelayError(err.code(), err.details() or "") from err

    def _data_port(self, grant: pb.TransferGrant) -> int:
        return grant.tls_port if self._tls is not None else grant.port

    def _dial(self, grant: pb.TransferGrant, direction: int):
        return self.kept.dial(self._data_host, self._data_port(grant), self._tls, direction, grant.version, grant.token)

    def push_data(self, manifest: Manifest, version: int, frames, sender: str = "trainer",
                  delta: dict | None = None) -> bool:
        """Push over the data channel: ``frames(start)`` yields (index, digest, bytes) from chunk
        ``start`` (what the relay already holds in a row), then (END, version digest, b"");
        ``delta``: the manifest's delta fields (``convert.delta_fields``)."""
        while True:
            grant = self.open_transfer(pb.TransferRequest(
                direction="push", version=version, manifest=manifest_to_pb(manifest, version, **(delta or {})),
                sender=sender))
            sock, reused = self._dial(grant, dc.PUSH)
            try:
                # closes the socket unless it ended cleanly
                answer = datapath.send_version(sock, frames(grant.from_chunk))
            except RelayError as err:
                if not (reused and err.code == grpc.StatusCode.UNAVAILABLE):
                    raise
                log.info("kept data connection to %s was gone (%s); pushing version %d again on a new one",
                         self.address, err, version)
                continue  # a fresh connection next (the relay resumes from what it holds)
            self.kept.give(self._data_port(grant), sock)
            return bool(answer.get("committed"))

    def try_data_channel(self, fn, *args):
        """Run ``fn`` over the data channel; None (and a log line) when the channel cannot be
        reached, so the caller streams over gRPC instead (for the next ``DATA_RETRY_S`` too: a
        firewalled port would otherwise cost a connect timeout per transfer)."""
        if time.monotonic() < self._data_down_until:
            return None
        try:
            return fn(*args)
        except datapath.DataChannelUnreachable as err:
            self._data_down_until = time.monotonic() + DATA_RETRY_S
            log.warning("%s; falling back to gRPC streaming (next try in %.0f s)", err, DATA_RETRY_S)
        except RelayError as err:
            if err.code != grpc.StatusCode.UNIMPLEMENTED:
                raise
            log.warning("relay %s has no data channel (%s); falling back to gRPC streaming", self.address, err)
        return None

    def push_stream(self, messages: Iterator[pb.PushMessage]) -> pb.PushAck:
        """A raw push stream (relay forwarding: chunks as they arrive upstream)."""
        return self._call_push(messages)

    def _call_push(self, messages) -> pb.PushAck:
        try:
            return self._push(messages, timeout=self.timeout_s)
        except grpc.RpcError as err:
            raise RelayError(err.code(), err.details() or "") from err

    def _same_host(self) -> bool:
        try:
            return self.versions().host_id == self._host
        except grpc.RpcError:
            return False

