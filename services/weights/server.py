"""The weight relay's gRPC edge: Push, Pull, Versions, Heartbeat, SetChain, and forwarding.

Push streams write into the ``VersionStore`` (validation, locking: see ``store``); a version
becomes visible to Pull only once committed. As soon as a version starts arriving, one
forwarder per branch of this relay's plan (``chain``) pushes its chunks to the branch's first
live relay *as they arrive* (Laminar §4.2, chained pipelined broadcast). A forwarder that
loses its next hop (UNAVAILABLE / DEADLINE_EXCEEDED) re-links in O(1): it skips to the next
relay of the branch, asks how much of the version that relay already holds, and resumes from
there (Laminar §4.3), while the controller re-plans for everyone. ``SetChain`` with an
``upstream`` makes a restarted relay catch up from its neighbour (it pulls the neighbour's
latest version when it holds nothing as new).

Status codes: INVALID_ARGUMENT (malformed stream, out-of-order chunk, layout not matching the
manifest), ALREADY_EXISTS (a version or chunk already held), FAILED_PRECONDITION (older
version, a different model's parameters), DATA_LOSS (digest mismatch), NOT_FOUND (version
not held: the message names the versions held). Committed versions are never touched by a
refused push.

Test hooks (``BRAID_RELAY_FAULTS``, semicolon-separated): ``corrupt_chunk=I[,I...]`` flips
one byte of chunk I the first time this relay serves it in a pull (transit corruption; the
chunk digest is left as it was); ``forward_delay_ms=N`` sleeps N ms before forwarding each
chunk (a slow hop, so a test can kill a relay mid-broadcast); ``truncate_pull=N`` closes the
first data-channel pull after N chunks (a broken connection, so a test sees the resume).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path

import grpc

from services.common.address import parse_address
from services.common.certs import TlsFiles
from services.common.rpc import MB, bind, new_server
from services.common.weights import WeightError, blob_chunk
from services.proto import braid_pb2 as pb
from services.proto import braid_pb2_grpc as pb_grpc
from services.weights.blob import SHM_PREFIX, Blob, host_id
from services.weights.client import RelayClient, RelayError
from services.weights.convert import delta_base, delta_fields, manifest_from_pb, manifest_to_pb
from services.weights.datachan import END
from services.weights.delta_log import DeltaLog
from services.weights.store import Incoming, Stored, VersionStore, wait_limit
from services.weights.wire import WEIGHT_ERROR_CODES, chunk_of, encode_chunk, service_handler

log = logging.getLogger("braid.relay")

CODES = WEIGHT_ERROR_CODES
HOP_LOST = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
MAX_WAIT_S = 600.0
FORWARD_CHUNK_WAIT_S = 30.0  # an upstream silent this long: the forwarder gives up (the plan moved on)


class RelayServicer(pb_grpc.WeightRelayServicer):
    def __init__(
        self, store: VersionStore, relay_id: str, *, tls: TlsFiles | None = None,
        max_message_mb: int = 256, hop_timeout_s: float = 600.0, data_path: str = "tcp",
    ) -> None:
        self.store = store
        self.relay_id = relay_id
        self.host = host_id()
        self.epoch = 0
        self.branches: list[list[str]] = []
        self.upstream = ""
        self.tls = tls  # this site's client certificate for cross-site peers (addresses "tls://host:port")
        self.max_message_mb = max_message_mb
        self.data_path = data_path  # how this relay forwards to its peers: "tcp" (data channel) or "grpc"
        self.hop_timeout_s = hop_timeout_s
        self.relinks: list[dict] = []  # one record per re-link (dead hop, skipped to, seconds)
        self.deltas = DeltaLog()  # the deltas versions arrived as, for pullers one or more versions behind
        self._lock = threading.Lock()
        self._peers: dict[str, RelayClient] = {}
        self.data = None  # the raw-TCP data channel (attach_data_plane)
        self._forwarding: set[int] = set()
        self._committed_at: dict[int, float] = {}
        faults = dict(f.split("=", 1) for f in os.environ.get("BRAID_RELAY_FAULTS", "").split(";") if "=" in f)
        self._corrupt = {int(i) for i in faults.get("corrupt_chunk", "").split(",") if i}
        self._forward_delay_s = float(faults.get("forward_delay_ms", 0)) / 1000.0
        self._truncate = [int(faults["truncate_pull"])] if "truncate_pull" in faults else []

    # ------------------------------------------------------------------ push
    def Push(self, request_iterator, context):
        first, _ = next(request_iterator, (None, None))
        if first is None or not first.HasField("manifest"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first push message must carry the manifest")
        parts = max(1, first.parts)
        if first.part >= parts:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"part {first.part} of {parts}")
        version = first.manifest.version
        inc: Incoming | None = None
        received = nbytes = 0
        refused = True
        try:
            manifest = manifest_from_pb(first.manifest)
            inc = (self._adopt(first, manifest) if first.manifest.shm_path
                   else self.store.begin(version, manifest, delta_base=delta_base(first.manifest)))
            self.store.attach(inc)
            self._start_forwarding(inc)
            last = -1
            if first.version_digest:
                self.store.set_digest(inc, first.version_digest)
            refused = False
            for msg, data in request_iterator:
                refused = True
                if msg.HasField("manifest"):
                    raise WeightError("argument", "manifest repeated inside one push stream")
                if msg.HasField("chunk"):
                    chunk = chunk_of(msg.chunk, data)
                    self.store.add(inc, chunk, first.part, parts, last)
                    last = chunk.index
                    received += 1
                    nbytes += len(chunk.data)
                if msg.version_digest:
                    self.store.set_digest(inc, msg.version_digest)
                refused = False
            committed = self._commit(inc)
        except WeightError as err:
            if inc is not None and err.kind == "integrity" and "version digest" in str(err):
                self.store.discard(inc)  # an inconsistent set of chunks: nothing of it is kept
            context.abort(CODES[err.kind], str(err))
        finally:
            if inc is not None:
                self.store.detach(inc, refused)
        return pb.PushAck(version=version, committed=committed, bytes=nbytes, chunks=received)

    def _adopt(self, first: pb.PushMessage, manifest) -> Incoming:
        """Push by reference: take over a same-host shared-memory file after checking it."""
        m = first.manifest
        path = Path(m.shm_path)
        if self.store.shm_dir is None or m.host_id != self.host:
            raise WeightError("precondition", "this relay cannot adopt shared memory from that host; stream the chunks")
        if ((path.parent != Path("/dev/shm") and path.parent.parent != Path("/dev/shm"))
                or not path.name.startswith(SHM_PREFIX)):
            raise WeightError("argument", f"shm_path {str(path)!r} is not a braid blob in /dev/shm")
        if not path.is_file():
            raise WeightError("argument", f"shm_path {str(path)!r} is not a file")
        manifest.validate()
        try:
            blob = Blob(manifest.total_bytes, path=path)
            blob.move_to(self.store.shm_dir)
        except OSError as err:
            raise WeightError("argument", f"shm_path {str(path)!r} cannot be adopted: {err}") from None
        try:
            inc = self.store.begin(m.version, manifest, blob=blob, delta_base=delta_base(m))
        except WeightError:
            blob.release()
            raise
        if inc.blob is not blob:
            blob.release()
            raise WeightError("exists", f"version {m.version} is already arriving here")
        try:
            self.store.add_digests(inc, list(m.chunk_digests))
        except WeightError:
            self.store.discard(inc)
            raise
        return inc

    def _commit(self, inc: Incoming) -> bool:
        committed = self.store.try_commit(inc)
        if committed and inc.version not in self._committed_at:
            self._committed_at[inc.version] = time.time()
            with self.store.cond:
                stored, held = self.store.committed.get(inc.version), set(self.store.committed)
            if stored is not None:
                self.deltas.add(stored)
            self.deltas.forget(held)
            log.info("version %d committed (%d bytes)", inc.version, inc.manifest.total_bytes)
            self.store.prepare_spare(inc.manifest.total_bytes)
        return committed

    # ------------------------------------------------------------------ pull
    def Pull(self, request: pb.PullRequest, context):
        parts = max(1, request.parts)
        if request.part >= parts:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"part {request.part} of {parts}")
        try:
            with self.store.pinned(request.version, caller_wait(request.wait_s, context)) as full:
                shm = request.allow_shm and full.blob.path is not None and request.host_id == self.host
                # the same host maps the full version (no copy); another takes the delta from what it holds
                s = full if shm or not request.delta_ok else self.deltas.for_puller(full, request.have_version,
                                                                                    request.have_digest)
                plan = s.manifest.plan
                stop = request.to_chunk or len(plan)
                if not request.from_chunk <= stop <= len(plan):
                    raise WeightError("argument", f"chunk range [{request.from_chunk}, {stop}) outside 0..{len(plan)}")
                head = manifest_to_pb(
                    s.manifest, s.version, version_digest=s.digest, host_id=self.host,
                    chunk_digests=list(s.digests) if shm else [], shm_path=str(s.blob.path) if shm else "",
                    **delta_fields(s, full),
                )
                yield pb.PullMessage(manifest=head)
                if shm or request.head_only:
                    return
                for ref in plan[request.from_chunk : stop]:
                    if parts > 1 and ref.index % parts != request.part:
                        continue
                    chunk = blob_chunk(s.manifest, s.blob.view, ref, s.version, s.digests[ref.index])
                    data = chunk.data
                    if ref.index in self._corrupt:
                        self._corrupt.discard(ref.index)
                        data = bytes([data[0] ^ 0xFF]) + bytes(data[1:])
                    yield encode_chunk(chunk, data)
        except WeightError as err:
            context.abort(CODES[err.kind], str(err))

    # ------------------------------------------------------------------ data channel
    def attach_data_plane(self, host: str, tls_host: str | None = None, port: int = 0, tls_port: int = 0,
                          advertise: tuple[int, int] = (0, 0)) -> None:
        """Serve the raw-TCP data channel (``dataplane``) on ``host`` (and mutual TLS on ``tls_host``);
        ``advertise``: the (plain, TLS) ports grants name instead of the bound ones (0 = bound)."""
        from services.weights.dataplane import RelayDataPlane

        self.data = RelayDataPlane(self.store, host, on_begin=self._start_forwarding, on_commit=self._commit,
                                   source=self.deltas.for_puller,
                                   corrupt=self._corrupt, truncate=self._truncate, tls=self.tls, tls_host=tls_host,
                                   port=port, tls_port=tls_port, advertise=advertise)

    def OpenTransfer(self, request: pb.TransferRequest, context) -> pb.TransferGrant:
        if self.data is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this relay serves no data channel; use Push/Pull streams")
        secure = context.auth_context().get("transport_security_type") == [b"ssl"]
        try:
            return self.data.open(request, secure, caller_wait(request.wait_s, context))
        except WeightError as err:
            context.abort(CODES[err.kind], str(err))

    # ------------------------------------------------------------------ control
    def Versions(self, request, context) -> pb.VersionsReply:
        with self.store.cond:
            infos = [
                pb.VersionInfo(version=v, bytes=s.manifest.total_bytes, chunks=len(s.digests), digest=s.digest,
                               complete=True, received=len(s.digests), fingerprint=s.manifest.fingerprint(),
                               committed_at=self._committed_at.get(v, 0.0), delta=s.delta is not None,
                               delta_base=s.delta_base)
                for v, s in sorted(self.store.committed.items())
            ] + [
                pb.VersionInfo(version=v, bytes=i.manifest.total_bytes, chunks=len(i.digests), complete=False,
                               received=i.prefix, fingerprint=i.manifest.fingerprint(), delta=i.delta_base is not None,
                               delta_base=-1 if i.delta_base is None else i.delta_base)
                for v, i in sorted(self.store.incoming.items())
            ]
            latest = max(self.store.committed, default=-1)
        flat = [r for b in self.branches for r in b[:1]]
        return pb.VersionsReply(relay_id=self.relay_id, versions=infos, latest=latest, downstream=flat,
                                host_id=self.host)

    def Heartbeat(self, request, context) -> pb.VersionsReply:
        return self.Versions(None, context)

    def SetChain(self, request: pb.ChainRequest, context) -> pb.ChainReply:
        if (why := chain_problem(request)) is not None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, why)
        with self._lock:
            if request.epoch >= self.epoch:
                self.epoch = request.epoch
                branches = [list(b.relays) for b in request.branches]
                changed = branches != self.branches
                self.branches = branches
                if changed:
                    threading.Thread(target=self._sync_branches, daemon=True).start()
                    for branch in branches:  # connect now, so the first chunk of a broadcast pays no handshake
                        threading.Thread(target=self._warm, args=(branch[0],), daemon=True).start()
                if request.upstream and request.upstream != self.upstream:
                    self.upstream = request.upstream
                    threading.Thread(target=self._catch_up, args=(request.upstream,), daemon=True).start()
            return pb.ChainReply(epoch=self.epoch)

    # ------------------------------------------------------------------ forwarding
    def peer(self, address: str) -> RelayClient:
        """A client for ``address``; ``tls://host:port`` (a cross-site peer) uses mutual TLS."""
        with self._lock:
            client = self._peers.get(address)
            if client is None:
                secure = address.startswith("tls://")
                if secure and self.tls is None:
                    raise RelayError(grpc.StatusCode.FAILED_PRECONDITION,
                                     f"{address} needs TLS; this relay has no certificate")
                client = RelayClient(address.removeprefix("tls://"), tls=self.tls if secure else None,
                                     max_message_mb=self.max_message_mb, timeout_s=self.hop_timeout_s,
                                     data_path=self.data_path)
                self._peers[address] = client
            return client

    def _start_forwarding(self, inc) -> None:
        """Forward ``inc`` (arriving or committed) down every branch not yet given it."""
        with self._lock:
            todo = [list(b) for b in self.branches if (inc.version, tuple(b)) not in self._forwarding]
            self._forwarding.update((inc.version, tuple(b)) for b in todo)
        for branch in todo:
            threading.Thread(target=self._forward, args=(inc, branch), name=f"fwd-{inc.version}", daemon=True).start()

    def _warm(self, address: str) -> None:
        # a dead hop is the forwarder's and the controller's business
        with contextlib.suppress(grpc.RpcError, RelayError):
            self.peer(address).versions(timeout_s=2.0)

    def _sync_branches(self) -> None:
        """After a re-plan, make sure each new branch head has the newest version held or
        arriving here (the forwarder returns at once if it does): a version whose broadcast
        was cut by a dead relay still reaches the relays below it."""
        with self.store.cond:
            items = list(self.store.incoming.values())
            if self.store.committed:
                items.append(self.store.committed[max(self.store.committed)])
        for item in items:
            self._start_forwarding(item)

    def _forward(self, inc: Incoming, branch: list[str]) -> None:
        """Push ``inc`` down ``branch``, chunks as they arrive; skip dead hops (O(1) re-link)."""
        dead: set[str] = set()
        lost_at = 0.0
        while True:
            live = [r for r in branch if r not in dead]
            if not live:
                return
            target = live[0]
            try:
                progress = self.peer(target).versions(timeout_s=2.0).versions.get(inc.version)
                if lost_at:
                    self.relinks.append({"dead": sorted(dead), "to": target, "seconds": time.monotonic() - lost_at})
                    log.warning("re-linked version %d to %s after losing %s", inc.version, target, sorted(dead))
                    lost_at = 0.0
                if progress is not None and progress.complete:
                    return
                start = progress.received if progress is not None else 0
                self._forward_to(self.peer(target), inc, start)
                return
            except (RelayError, grpc.RpcError) as err:
                code = err.code if isinstance(err, RelayError) else err.code()
                if code in HOP_LOST:
                    dead.add(target)
                    lost_at = lost_at or time.monotonic()
                    log.warning("relay %s lost while forwarding version %d: %s", target, inc.version, err)
                elif code == grpc.StatusCode.ALREADY_EXISTS:
                    time.sleep(0.2)  # another upstream is delivering it; check progress again
                elif delta_fields(inc):  # the hop lacks the delta's base (or could not apply it): send it whole
                    full = self._whole(inc, target, err)
                    if full is None:
                        return
                    inc = full
                else:
                    log.error("forwarding version %d to %s failed: %s", inc.version, target, err)
                    return

    def _whole(self, inc: Incoming, target: str, err) -> Stored | None:
        """The full version a delta leads to, once committed here, to forward instead (counted)."""
        deadline = time.monotonic() + self.hop_timeout_s
        with self.store.cond:
            while inc.version not in self.store.committed and self.store.incoming.get(inc.version) is inc:
                if time.monotonic() > deadline:
                    break
                self.store.cond.wait(0.5)
            full = self.store.committed.get(inc.version)
        if full is None:
            log.error("relay %s refused delta %d -> %d (%s) and the version never committed here", target,
                      inc.delta_base, inc.version, err)
            return None
        log.info("relay %s lacks the base of delta %d -> %d: forwarding version %d whole (%s)", target,
                 inc.delta_base, inc.version, inc.version, err)
        return full

    def _forward_to(self, peer: RelayClient, inc: Incoming, start: int) -> None:
        """Forward over the data channel when the peer's is reachable, else over a gRPC stream."""
        if peer.data_path == "tcp":
            done = peer.try_data_channel(peer.push_data, inc.manifest, inc.version,
                                         lambda s: self._forward_frames(inc, s), self.relay_id, delta_fields(inc))
            if done is not None:
                return
        peer.push_stream(self._forward_messages(inc, start))

    def _forward_frames(self, inc: Incoming, start: int):
        """Data-channel frames of ``inc`` from chunk ``start``, each as soon as it is in here."""
        for ref in inc.manifest.plan[start:]:
            if not self.store.wait_prefix(inc, ref.index, FORWARD_CHUNK_WAIT_S):
                raise RelayError(grpc.StatusCode.ABORTED, f"version {inc.version} was dropped here")
            if self._forward_delay_s:
                time.sleep(self._forward_delay_s)
            yield ref.index, inc.digests[ref.index] or "", inc.blob.view[ref.blob_offset : ref.blob_offset + ref.length]
        yield END, self._final_digest(inc), b""

    def _final_digest(self, inc: Incoming) -> str:
        deadline = time.monotonic() + FORWARD_CHUNK_WAIT_S
        with self.store.cond:
            while inc.digest is None and time.monotonic() < deadline:
                self.store.cond.wait(0.5)
        return inc.digest or ""

    def _forward_messages(self, inc: Incoming, start: int):
        m = inc.manifest
        yield pb.PushMessage(manifest=manifest_to_pb(m, inc.version, **delta_fields(inc)), part=0, parts=1,
                             sender=self.relay_id)
        for ref in m.plan[start:]:
            if not self.store.wait_prefix(inc, ref.index, FORWARD_CHUNK_WAIT_S):
                return  # the version was dropped here (refused or abandoned upstream)
            if self._forward_delay_s:
                time.sleep(self._forward_delay_s)
            chunk = blob_chunk(m, inc.blob.view, ref, inc.version, inc.digests[ref.index] or "")
            yield encode_chunk(chunk, chunk.data)
        yield pb.PushMessage(version_digest=self._final_digest(inc))

    def _catch_up(self, upstream: str) -> None:
        """A (re)started relay takes its neighbour's latest version when it holds nothing as new."""
        try:
            peer = self.peer(upstream)
            latest = peer.versions(timeout_s=5.0).latest
            if latest <= self.store.latest() or latest in self.store.incoming:
                return
            head, chunks = peer.iter_pull(latest)
            inc = self.store.begin(head.version, manifest_from_pb(head))
            self._start_forwarding(inc)
            last = -1
            for c in chunks:
                self.store.add(inc, c, 0, 1, last)
                last = c.index
            self.store.set_digest(inc, head.version_digest)
            self._commit(inc)
            log.info("caught up to version %d from %s", head.version, upstream)
        except (WeightError, RelayError, grpc.RpcError) as err:
            log.warning("catch-up from %s failed: %s", upstream, err)

    def close(self) -> None:
        if self.data is not None:
            self.data.close()
        self.deltas.close()
        with self._lock:
            for c in self._peers.values():
                c.close()


def caller_wait(wait_s: float, context) -> float:
    """How long a pull may wait for its version: what it asked (NaN refused, at most ``MAX_WAIT_S``)
    and never past its own deadline (a caller that gave up must not hold a relay thread)."""
    wait_s = wait_limit(wait_s, MAX_WAIT_S)
    remaining = context.time_remaining()
    return wait_s if remaining is None else min(wait_s, max(remaining, 0.0))


MAX_BRANCHES = 256  # a relay forwards to each branch head itself: one thread and one connection per branch
MAX_CHAIN = 4096


def chain_problem(request: pb.ChainRequest) -> str | None:
    """Why a chain plan cannot be followed (empty branch, malformed address), or None."""
    if len(request.branches) > MAX_BRANCHES:
        return f"{len(request.branches)} branches; a relay forwards to at most {MAX_BRANCHES}"
    addresses = [a for b in request.branches for a in b.relays] + ([request.upstream] if request.upstream else [])
    if any(not b.relays or len(b.relays) > MAX_CHAIN for b in request.branches):
        return f"every branch must name 1..{MAX_CHAIN} relays"
    for address in addresses:
        try:
            parse_address(address.removeprefix("tls://"))
        except ValueError as err:
            return f"chain plan: {err}"
    return None


def create_server(
    servicer: RelayServicer, address: str, *, max_message_mb: int, tls_address: str | None = None,
    tls: TlsFiles | None = None, workers: int = 32,
) -> tuple[grpc.Server, int, int]:
    """A server on ``address`` (plaintext, for the site's own processes) and, with ``tls``, on
    ``tls_address`` (mutual TLS, for other sites); returns (server, port, tls_port or 0)."""
    server = new_server(workers=workers, thread_name_prefix="relay-rpc", max_message_bytes=max_message_mb * MB)
    server.add_generic_rpc_handlers((service_handler(servicer),))
    port = bind(server, address)
    tls_port = bind(server, tls_address, tls, label=" (TLS)") if tls is not None and tls_address is not None else 0
    return server, port, tls_port
