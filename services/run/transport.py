"""How the trainer's weight versions reach the SGS instances: transports behind one interface.

DESIGN §3.3 (prime-rl's ``transports/base.py``): the trainer's ``WeightPublisher`` asks the
configured transport (``weights.transport``, a registry key) for three things:

- ``snapshot(state)`` — copy the weights (Hugging Face–named: a state dict, or a ``WeightStream``
  a sharded trainer gathers tensor by tensor as it is drawn) out: the trainer's only stall;
- ``publish(version, snap)`` — hand the version over without waiting (the trainer goes on);
- ``deliver(client, version, snap)`` — bring one SGS instance to ``version`` or newer; called
  on that instance's pusher thread, so it may block.

``direct`` streams each version to every instance (``UpdateWeights``: the skeleton's path,
one copy per instance from the trainer). ``relay`` (Laminar §4, StaleFlow's parameter server)
pushes each version once to the master relay on a background thread (superseded versions are
skipped), and ``deliver`` tells the instance to pull it from its local relay
(``PullWeights``): the relays broadcast it down the chain meanwhile. A chain controller
heartbeats the relays and, if the master dies, tells this transport where to push instead.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from services.common.config import WeightsConfig
from services.common.newest import NewestSender
from services.common.registry import Registry
from services.common.weights import WeightStream
from services.generation.client import GenerationClient

log = logging.getLogger("braid.weights.transport")
MASTER_RETRIES = 20
RELAY_DOWN_WAIT_S = 60.0  # how long an instance whose relay is unreachable (restarting) is retried


class WeightTransport(ABC):
    name: str

    @abstractmethod
    def snapshot(self, state: Mapping[str, torch.Tensor] | WeightStream): ...

    def publish(self, version: int, snap) -> None:  # noqa: B027 - optional hook: direct delivery needs none
        """Hand a version over (non-blocking). Default: nothing (``deliver`` sends it)."""

    @abstractmethod
    def deliver(self, client: GenerationClient, version: int, snap) -> None: ...

    def newest_held(self) -> int:
        """The newest version the transport's own servers hold or receive (-1: none; direct: none)."""
        return -1

    def delta_metrics(self) -> dict[str, int]:
        """Cumulative counts of versions sent and taken as deltas, whole, and whole after a refused
        delta (``weights.delta``; none otherwise), for the run's metrics."""
        return {}

    def raise_if_failed(self) -> None:  # noqa: B027 - optional hook: no background work, nothing to raise
        """Raise in the trainer if a background hand-over failed."""

    def close(self) -> None:  # noqa: B027 - optional hook: no background work to stop
        """Stop background work."""


TRANSPORTS: Registry[Callable[..., WeightTransport]] = Registry("weight transport")
register_transport = TRANSPORTS.register


def create_transport(key: str, cfg: WeightsConfig, **kwargs) -> WeightTransport:
    return TRANSPORTS[key](cfg, **kwargs)


@register_transport("direct")
class DirectTransport(WeightTransport):
    """Stream every version to every instance (``UpdateWeights``)."""

    name = "direct"

    def __init__(self, cfg: WeightsConfig, *, chunk_bytes: int | None = None, **_) -> None:
        self.chunk_bytes = chunk_bytes or cfg.chunk_bytes

    def snapshot(self, state: Mapping[str, torch.Tensor] | WeightStream) -> dict[str, torch.Tensor]:
        # a host copy whatever the trainer's device: the gRPC stream reads host memory
        return WeightStream.of(state).host_copies()

    def deliver(self, client: GenerationClient, version: int, snap) -> None:
        client.update_weights(snap, version, chunk_bytes=self.chunk_bytes)


@register_transport("relay")
class RelayTransport(WeightTransport):
    """Push once to the master relay; instances pull from their local relay."""

    name = "relay"

    def __init__(self, cfg: WeightsConfig, *, relays: list[str], training_site: str = "local", tls=None, **_) -> None:
        """``relays``: ``host:port[@site[@tls://host:port]]``, the master first: its address on this
        site, its site (default: the training site) and, for another site, the address this
        site reaches it at (mutual TLS with ``tls``, this site's ``TlsFiles``)."""
        from services.weights.chain import RelayNode
        from services.weights.client import RelayClient
        from services.weights.controller import ChainController

        if not relays:
            raise ValueError("the relay transport needs at least one relay address")
        self.cfg = cfg
        self._client_cls = RelayClient
        self._cond = threading.Condition()
        self._master_client: RelayClient | None = None
        self._spare = None  # a pre-populated blob for the next snapshot (made after each push)
        self._base = None  # weights.delta: the last version pushed (delta_blob.Held), the next delta's base
        self.sent: dict[int, dict] = {}  # per version pushed: how (delta / whole / fallback), bytes, encode s
        self.pull_counts = {"delta": 0, "whole": 0, "fallback": 0}  # how instances took versions from relays
        self._shm = None
        if cfg.shm:
            from services.weights.blob import private_shm_dir

            self._shm = private_shm_dir("trainer")
        nodes = []
        for spec in relays:
            address, _, rest = spec.partition("@")
            site, _, remote = rest.partition("@")
            nodes.append(RelayNode(address, site or training_site, True, remote))
        self.controller = ChainController(
            nodes, training_site, heartbeat_s=cfg.heartbeat_s, timeout_s=cfg.heartbeat_timeout_s,
            on_master=self._set_master, tls=tls,
        )
        self.controller.start()
        self._sender = NewestSender(self._send, name="relay-push", on_drop=lambda wb: wb.blob.release(),
                                    after_send=lambda v, wb: self._prepare_spare(wb.manifest.total_bytes))

    @property
    def pushed(self) -> int:  # newest version the master holds
        return self._sender.sent

    @property
    def push_seconds(self) -> dict[int, float]:
        return self._sender.seconds

    def _set_master(self, address: str) -> None:
        with self._cond:
            old, self._master_client = self._master_client, self._client_cls(address, data_path=self.cfg.data_path)
            self._cond.notify_all()
        if old is not None:
            old.close()

    def snapshot(self, state: Mapping[str, torch.Tensor] | WeightStream):
        """Tensor by tensor into one blob (shared memory the master relay adopts on this host):
        a stream from a sharded trainer never exists as a second full copy on any rank."""
        from services.weights.client import snapshot_blob

        with self._cond:
            spare, self._spare = self._spare, None
        return snapshot_blob(state, self.cfg.chunk_bytes, self._shm_dir, spare, dtype=self.cfg.dtype)

    @property
    def _shm_dir(self) -> Path | None:
        return self._shm

    @property
    def spare_ready(self) -> bool:
        """True when the next snapshot has a pre-populated buffer (it copies at memory speed)."""
        return self._spare is not None

    def _prepare_spare(self, size: int) -> None:
        """Allocate and fault in the next snapshot's buffer off the trainer's thread."""
        from services.weights.blob import Blob

        with self._cond:
            if self._spare is not None and self._spare.size == size:
                return
        spare = Blob(size, self._shm_dir, populate=True)
        with self._cond:
            old, self._spare = self._spare, spare
        if old is not None:
            old.release()

    def publish(self, version: int, snap) -> None:
        self.raise_if_failed()
        self._sender.offer(version, snap)  # a version superseded before it was sent is released unsent

    def deliver(self, client: GenerationClient, version: int, snap) -> None:
        try:
            target = self._sender.wait_sent(version)
        except RuntimeError:
            self.raise_if_failed()
            raise
        ack = _pull_through_relay_restart(client, target, self.cfg.pull_wait_s)
        if ack.staged:
            kind = "delta" if ack.path.startswith("delta") else "fallback" if ack.delta_fallback else "whole"
            with self._cond:
                self.pull_counts[kind] += 1

    def newest_held(self) -> int:
        """The newest version any reachable relay holds, complete or still arriving."""
        import grpc

        newest = -1
        for client in self.controller.clients():
            try:
                info = client.versions()
            except grpc.RpcError as err:  # a dead relay holds nothing a pull could reach
                log.warning("relay %s: no version list (%s)", client.address, err.code())
                continue
            newest = max(newest, info.latest, *info.versions)
        return newest

    def raise_if_failed(self) -> None:
        error = self._sender.error
        if error is not None:
            raise RuntimeError(f"weight push to the master relay failed: {error}") from error

    def close(self) -> None:
        self._sender.close()
        self.controller.stop()
        if self._spare is not None:
            self._spare.release()
        if self._base is not None:
            self._base.data.release()
        if self._shm is not None:
            import shutil

            shutil.rmtree(self._shm, ignore_errors=True)

    def _send(self, version: int, wb) -> None:
        if not self.cfg.delta:
            try:
                self._push_with_failover(version, wb)
            finally:
                wb.blob.release()
            return
        from services.weights.delta_blob import Held

        digest = None
        try:
            digest = self._send_delta(version, wb)
        finally:
            old, self._base = self._base, None
            if digest is not None:  # the master holds this version: the next delta's base
                self._base = Held(version, wb.manifest, wb.blob.view, digest, data=wb.blob)
            else:
                wb.blob.release()
            if old is not None:
                old.data.release()

    def _send_delta(self, version: int, wb) -> str:
        """Push ``version`` as the delta from the last version pushed when that pays, else whole; a
        master without the base (restarted, a new master) takes it whole (counted). Returns its digest."""
        from services.weights import delta_blob
        from services.weights.client import RelayError

        t0 = time.perf_counter()
        enc = delta_blob.encode(wb.manifest, wb.blob.view, version=version, base=self._base, algo=self.cfg.digest,
                                shm_dir=self._shm_dir)
        row = {"full_bytes": wb.manifest.total_bytes, "delta_bytes": enc.delta_bytes,
               "encode_s": round(time.perf_counter() - t0, 4), "digest": enc.digest}
        if enc.delta is not None:
            try:
                self._push_with_failover(version, enc.delta, delta_base=self._base.version)
                self.sent[version] = {**row, "sent": "delta"}
                return enc.digest
            except RelayError as err:  # no base there (a restarted or new master), or a delta it could not apply
                row["fallback"] = str(err)
                log.warning("version %d: the master took no delta (%s); pushing it whole", version, err)
            finally:
                enc.delta.blob.release()
        self._push_with_failover(version, wb, digests=enc.chunk_digests)
        self.sent[version] = {**row, "sent": "fallback" if "fallback" in row else "whole"}
        return enc.digest

    def delta_counts(self) -> dict[str, int]:
        """Versions pushed as deltas, whole (no base, or no smaller), and whole after a refused delta."""
        counts = {"delta": 0, "whole": 0, "fallback": 0}
        for row in list(self.sent.values()):
            counts[row["sent"]] += 1
        return counts

    def delta_metrics(self) -> dict[str, int]:
        if not self.cfg.delta:
            return {}
        with self._cond:
            pulls = dict(self.pull_counts)
        pushes = self.delta_counts()
        return {**{f"weights_pushed_{k}": n for k, n in pushes.items()},
                **{f"weights_pulled_{k}": n for k, n in pulls.items()}}

    def _push_with_failover(self, version: int, wb, *, delta_base: int | None = None,
                            digests: list[str] | None = None) -> None:
        """Push to the master; if it is unreachable, wait for the controller to name another."""
        import grpc

        from services.weights.client import RelayError

        for attempt in range(MASTER_RETRIES):
            with self._cond:
                master = self._master_client
            try:
                master.push(wb, version, streams=self.cfg.streams, use_shm=self.cfg.shm, algo=self.cfg.digest,
                            delta_base=delta_base, digests=digests)
                return
            except RelayError as err:
                if err.code == grpc.StatusCode.ALREADY_EXISTS:
                    return
                if err.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                log.warning("master relay %s unreachable (%s); waiting for a new master", master.address, err)
                self.controller.tick()
                time.sleep(min(1.0, 0.1 * (attempt + 1)))
        raise RuntimeError(f"no master relay accepted version {version} after {MASTER_RETRIES} tries")


def _pull_through_relay_restart(client: GenerationClient, version: int, wait_s: float):
    """Tell the instance to pull ``version``; an UNAVAILABLE from an instance that still answers
    ``Health`` means its relay is down (being restarted, or cut out of the chain): retry for up to
    ``RELAY_DOWN_WAIT_S``. An instance that does not answer is lost: the error goes up."""
    import grpc

    deadline = time.monotonic() + RELAY_DOWN_WAIT_S
    while True:
        try:
            return client.pull_weights(version, wait_s=wait_s)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            try:
                client.health()
            except grpc.RpcError:
                raise err from None  # the instance itself is gone
            log.warning("instance %s cannot reach its relay (%s); retrying", client.address, err.details())
            time.sleep(0.5)
