"""Weights pushed to the SGS instances on background threads.

``WeightPusher`` brings one instance to the newest
offered version from a background thread (a newer version supersedes one not yet sent);
``WeightPublisher`` snapshots the model once per version through the configured weight
transport (``services.run.transport``: ``direct`` streams to every instance, ``relay``
pushes once to the master relay and tells each instance to pull) and offers it to every
instance's pusher, so the trainer pays only for the snapshot copy.

With the run's fleet table (``services.rollout.fleet``; pusher ``i`` is row ``i``) and a workflow
that survives lost instances (``push_errors_fatal = False``), the table says whom to offer to and
wait for: ``offer`` and ``wait`` go to the rows that hold work (live or draining), and a push that
fails marks its row lost at once, on the pusher's own thread, before the pusher's ``error`` shows
(so any thread that sees the error sees the loss; the rollout thread's keeper resumes the
instance's work). A learner-thread ``offer`` or an end-of-run ``wait`` that races that failure
therefore neither raises nor waits for the lost instance. ``offer`` records the version each
instance was offered on its row. With failures fatal (no table, or a workflow that cannot lose an
instance), any thread's failure is re-raised in the trainer at its next call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch

from services.common.weights import WeightStream
from services.generation.client import GenerationClient
from services.rollout.fleet import HOLDS_WORK, Fleet

_END = object()
_GONE = ("lost", "removed")
WAIT_SLICE_S = 0.5  # how often ``wait`` looks again at a row it waits for (lost meanwhile: not waited for)


class WeightPublisher:
    """Fan-out of weight versions to every SGS instance (one ``WeightPusher`` each)."""

    def __init__(self, clients: list[GenerationClient], chunk_bytes: int, transport=None,
                 fleet: Fleet | None = None) -> None:
        if transport is None:
            from services.common.config import WeightsConfig
            from services.run.transport import create_transport

            transport = create_transport("direct", WeightsConfig(), chunk_bytes=chunk_bytes)
        self.transport = transport
        self.offset = 0  # version v is v + offset on the wire (a resumed trainer: services.run.resume)
        # a failed push to one instance ends the run, unless the workflow survives lost instances
        # (the orchestrator, the agentic runner) and the publisher has the table: then it loses that row
        self.push_errors_fatal = True
        self.fleet = fleet  # the run's table, row i = clients[i] (None: every pusher, as listed)
        self.clients = list(clients)
        self.pushers = [WeightPusher(self._deliverer(i, c)) for i, c in enumerate(clients)]

    def add(self, client: GenerationClient) -> WeightPusher:
        """A pusher for an instance that joins the run (scale-out; its row follows); readmission brings
        it up, then it is offered versions as a row that holds work."""
        self.clients.append(client)
        self.pushers.append(WeightPusher(self._deliverer(len(self.pushers), client)))
        return self.pushers[-1]

    def renew(self, i: int) -> WeightPusher:
        """A fresh pusher for instance ``i`` (restarted after it was lost: the old one's thread failed)."""
        self.pushers[i].close()
        self.pushers[i] = WeightPusher(self._deliverer(i, self.clients[i]))
        return self.pushers[i]

    def _deliverer(self, i: int, client: GenerationClient):
        def deliver(version: int, snap) -> None:  # on pusher i's thread
            row = self._row(i)  # the incarnation this delivery is for
            try:
                self.transport.deliver(client, version + self.offset, snap)
            except BaseException as exc:
                if self.survives and row is not None and row.state in HOLDS_WORK:
                    self.fleet.mark_lost(i, f"weight push failed: {exc}", epoch=row.epoch)
                raise  # the pusher's ``error``, set after the row is lost

        return deliver

    @property
    def survives(self) -> bool:
        """Whether a failed push loses its instance (on the table) rather than ending the run."""
        return self.fleet is not None and not self.push_errors_fatal

    def _row(self, i: int):
        if self.fleet is None:
            return None
        rows = self.fleet.snapshot()
        return rows[i] if i < len(rows) else None

    def _targets(self) -> list[int]:
        """The instances offered versions and waited for: the rows that hold work (without a table: all)."""
        if self.fleet is None:
            return list(range(len(self.pushers)))
        return [i for i in self.fleet.snapshot().in_state(*HOLDS_WORK) if i < len(self.pushers)]

    def snapshot(self, state: Mapping[str, torch.Tensor] | WeightStream, version: int):
        """Copy the weights (``Learner.weights()``) out, the trainer's stall, and hand the
        version to the transport."""
        self.raise_if_failed()
        snap = self.transport.snapshot(state)
        self.transport.publish(version + self.offset, snap)
        return snap

    def offer(self, version: int, snap) -> None:
        """Offer a snapshot to every instance that holds work (each pusher sends the newest it was
        offered)."""
        for i in self._targets():
            self.offer_to(i, version, snap)

    def offer_missing(self, version: int, snap) -> None:
        """Offer ``version`` to every instance that holds work and was not offered it (or newer) yet: an
        evaluation between steps brings the whole fleet to the step's weights without sending them twice."""
        for i in self._targets():
            if self.pushers[i].offered < version:
                self.offer_to(i, version, snap)

    def offer_to(self, i: int, version: int, snap) -> bool:
        """Offer a snapshot to instance ``i`` and record it on its row; False (nothing offered) when the
        row is lost or removed, or its push failed (the row was lost then). Raises that failure when
        failures are fatal."""
        if self.survives and self._row(i).state in _GONE:
            return False
        try:
            self.pushers[i].offer(version, snap)
        except RuntimeError:
            if not self.survives:
                raise
            return False  # it failed since: its row is lost
        if self.fleet is not None:
            self.fleet.record_version(i, self.pushers[i].offered)  # False, and nothing, if it was lost since
        return True

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
        """Block until every instance that holds work has ``version`` (or newer); one lost meanwhile
        (its push failed, or the rollout found it gone) is not waited for when failures are not fatal."""
        deadline = time.monotonic() + timeout_s
        for i in self._targets():
            self._wait_one(i, version, deadline, timeout_s)

    def _wait_one(self, i: int, version: int, deadline: float, timeout_s: float) -> None:
        survives = self.survives
        while True:
            if survives and self._row(i).state in _GONE:
                return
            left = deadline - time.monotonic()
            try:
                self.pushers[i].wait(version, min(left, WAIT_SLICE_S) if survives else left)
                return
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"weight version {version} not staged on instance {i} within {timeout_s}s") \
                        from None
            except RuntimeError:
                if not survives or self._row(i).state not in _GONE:  # failures that end the run
                    raise
                return

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
