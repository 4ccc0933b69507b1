"""Weights pushed to the SGS instances on background threads.

``WeightPusher`` brings one instance to the newest
offered version from a background thread (a newer version supersedes one not yet sent);
``WeightPublisher`` snapshots the model once per version through the configured weight
transport (``services.run.transport``: ``direct`` streams to every instance, ``relay``
pushes once to the master relay and tells each instance to pull) and offers it to every
instance's pusher, so the trainer pays only for the snapshot copy. A failure on any thread is
re-raised in the trainer at its next call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from services.common.weights import WeightStream
from services.generation.client import GenerationClient

_END = object()


class WeightPublisher:
    """Fan-out of weight versions to every SGS instance (one ``WeightPusher`` each)."""

    def __init__(self, clients: list[GenerationClient], chunk_bytes: int, transport=None) -> None:
        if transport is None:
            from services.common.config import WeightsConfig
            from services.run.transport import create_transport

            transport = create_transport("direct", WeightsConfig(), chunk_bytes=chunk_bytes)
        self.transport = transport
        self.offset = 0  # version v is v + offset on the wire (a resumed trainer: services.run.resume)
        # a failed push to one instance ends the run, unless the workflow survives lost instances
        # (the orchestrator: it checks each pusher's ``error`` itself and drops that instance)
        self.push_errors_fatal = True
        self.clients = list(clients)
        self.pushers = [WeightPusher(self._deliverer(c)) for c in clients]

    def add(self, client: GenerationClient) -> WeightPusher:
        """A pusher for an instance that joins the run (scale-out); it is offered versions from now on."""
        self.clients.append(client)
        self.pushers.append(WeightPusher(self._deliverer(client)))
        return self.pushers[-1]

    def renew(self, i: int) -> WeightPusher:
        """A fresh pusher for instance ``i`` (restarted after it was lost: the old one's thread failed)."""
        self.pushers[i].close()
        self.pushers[i] = WeightPusher(self._deliverer(self.clients[i]))
        return self.pushers[i]

    def _deliverer(self, client: GenerationClient):
        return lambda version, snap: self.transport.deliver(client, version + self.offset, snap)

    def snapshot(self, state: Mapping[str, torch.Tensor] | WeightStream, version: int):
        """Copy the weights (``Learner.weights()``) out, the trainer's stall, and hand the
        version to the transport."""
        self.raise_if_failed()
        snap = self.transport.snapshot(state)
        self.transport.publish(version + self.offset, snap)
        return snap

    def offer(self, version: int, snap) -> None:
        """Offer a snapshot to every instance (each pusher sends the newest it was offered). A pusher
        whose instance is gone raises here when failures are fatal; otherwise it is passed over: the
        workflow finds its ``error``, loses the instance and renews the pusher when it is back (an
        agentic run offered the next version before its tick had seen the failure, and died of it)."""
        for p in self.pushers:
            try:
                p.offer(version, snap)
            except RuntimeError:
                if self.push_errors_fatal:
                    raise

    @property
    def published(self) -> int:
        return min(p.published for p in self.pushers)

    @property
    def push_seconds(self) -> dict[int, float]:
        return {v: s for p in self.pushers for v, s in p.push_seconds.items()}

    def raise_if_failed(self) -> None:
        self.transport.raise_if_failed()
        if self.push_errors_fatal:
            for p in self.pushers:
                p.raise_if_failed()

    def wait(self, version: int, timeout_s: float = 600) -> None:
        """Block until every instance has ``version`` (or newer); one whose push failed is not waited
        for when failures are not fatal (a lost instance: the run's end must not die of it)."""
        for p in self.pushers:
            if p.error is not None and not self.push_errors_fatal:
                continue
            try:
                p.wait(version, timeout_s)
            except RuntimeError:
                if self.push_errors_fatal or p.error is None:  # a timeout, or failures that end the run
                    raise

    def close(self) -> None:
        for p in self.pushers:
            p.close()
        self.transport.close()


class WeightPusher:
    """Brings one SGS instance to the newest offered version from a background thread
    (``deliver(version, snapshot)``: the transport's delivery to that instance); a version
    superseded before it was sent is skipped (``services.common.newest``)."""

    def __init__(self, deliver: Callable[[int, object], None]) -> None:
        from services.common.newest import NewestSender

        self._sender: NewestSender[object] = NewestSender(deliver, name="weight-publisher")

    def offer(self, version: int, state) -> None:  # the transport's snapshot
        """Hand a version over; it replaces an older one not yet sent."""
        self.raise_if_failed()
        self._sender.offer(version, state)

    @property
    def published(self) -> int:  # newest version the instance has acknowledged (staged)
        return self._sender.sent

    @property
    def offered(self) -> int:  # newest version handed to this pusher
        return self._sender.offered

    @property
    def push_seconds(self) -> dict[int, float]:
        return self._sender.seconds

    @property
    def error(self) -> BaseException | None:
        return self._sender.error

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"weight push failed: {self.error}") from self.error

    def wait(self, version: int, timeout_s: float = 600) -> None:
        """Block until ``version`` (or newer) has been handed to the SGS."""
        try:
            self._sender.wait_sent(version, timeout_s, what="weight version")
        except RuntimeError:
            self.raise_if_failed()
            raise

    def close(self) -> None:
        self._sender.close()
