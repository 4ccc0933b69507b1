"""Weight fan-out of the SGS router: a version reaches every instance behind it.

Two paths, matching the weight transports (``services/run/transport.py``):

- ``push`` (``direct``): one incoming version stream forwarded to every instance. Each instance
  gets its own forwarding thread fed through a bounded queue, so chunks flow to all instances
  as they arrive (nothing is buffered whole) and a slow instance applies backpressure;
- ``pull`` (``relay``): every instance is told, in parallel, to pull the version from its own
  local relay (``PullWeights``); no weight bytes pass through the router.

The version counts as staged when **every** instance acked; the first instance failure is
reported with its gRPC status and the instance named.

Dynamic membership (scale-out, docs/scaleout.md): the instances are read from ``members()`` at
every version (the router's open slots and those still draining); a failure of an instance that
left ``members()`` while the version was on its way (drained, then stopped) is not the version's;
``bring_up(client)`` gives a joining instance the newest version the router has forwarded (the
``pull`` version from its relay, or a replay of the last ``push`` stream, which the router then
keeps in memory: ``keep_last``) under the same lock as ``push``/``pull``, so no version slips
between its bring-up and its first fan-out. ``on_staged(clients, version)`` hears of every
version that reached all its members (the router takes a lost instance back then).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc

from services.generation.client import GenerationClient, push_chunks
from services.proto import braid_pb2 as pb

_QUEUE_CHUNKS = 16  # chunks buffered per instance (backpressure beyond that)
_END = object()


class FanoutError(RuntimeError):
    """An instance refused or failed the version; ``code`` is its gRPC status."""

    def __init__(self, index: int, address: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"instance {index} ({address}): {details}")
        self.index, self.code = index, code


class WeightFanout:
    def __init__(
        self, clients: list[GenerationClient] | Callable[[], list[GenerationClient]], timeout_s: float = 600,
        *, keep_last: bool = False, on_staged: Callable[[list[GenerationClient], int], None] | None = None,
    ) -> None:
        self.members = clients if callable(clients) else (lambda: clients)
        self.on_staged = on_staged
        self.timeout_s = timeout_s
        self.keep_last = keep_last
        self.lock = threading.Lock()  # one version at a time; bring-ups wait for it
        self.last_push: list[pb.WeightChunk] | None = None  # direct transport, keep_last only
        self.last_pull: int | None = None  # relay transport: the version every instance pulled
        self.pushed = False  # a version was pushed (direct transport)
        self.clients: list[GenerationClient] = self.members()

    def push(self, chunks: Iterable[pb.WeightChunk]) -> list[pb.UpdateAck]:
        """Forward the stream to every instance; return their acks (raises ``FanoutError``)."""
        with self.lock:
            self.clients = self.members()
            kept: list[pb.WeightChunk] | None = [] if self.keep_last else None
            acks = self._push(_recording(chunks, kept))
            if kept is not None:
                self.last_push, self.last_pull = kept, None
            self._staged(acks)
            return acks

    def bring_up(self, client: GenerationClient, wait_s: float, join: Callable[[int], None]) -> int:
        """Give a joining instance the newest version forwarded so far, then ``join(version)`` it
        (still under the lock: the next version includes it); return that version (0: none was
        forwarded yet, it serves the checkpoint it started from). Raises ``FanoutError``."""
        with self.lock:
            version = self._catch_up(client, wait_s)
            join(version)
            return version

    def _catch_up(self, client: GenerationClient, wait_s: float) -> int:
        try:
            if self.last_pull is not None:  # the relay's latest (older ones may be evicted), at least last_pull
                version = int(client.pull_weights(-1, wait_s=wait_s).version)
                if version < self.last_pull:
                    version = int(client.pull_weights(self.last_pull, wait_s=wait_s).version)
                return version
            if self.last_push:
                return int(push_chunks(client, iter(self.last_push), self.timeout_s).version)
        except grpc.RpcError as err:
            raise FanoutError(-1, client.address, err.code(), err.details() or str(err)) from None
        if self.pushed:
            raise FanoutError(-1, client.address, grpc.StatusCode.FAILED_PRECONDITION,
                              "the router did not keep the last pushed version (generation.scaleout needs keep_last)")
        return 0

    def _push(self, chunks: Iterable[pb.WeightChunk]) -> list[pb.UpdateAck]:
        self.pushed = True
        queues = [queue.Queue(maxsize=_QUEUE_CHUNKS) for _ in self.clients]
        acks: list[pb.UpdateAck | None] = [None] * len(self.clients)
        errors: list[FanoutError | None] = [None] * len(self.clients)
        threads = [
            threading.Thread(target=self._forward, args=(i, q, acks, errors), name=f"fanout-{i}", daemon=True)
            for i, q in enumerate(queues)
        ]
        for t in threads:
            t.start()
        try:
            for chunk in chunks:
                for i, q in enumerate(queues):
                    self._put(q, chunk, threads[i])
        finally:
            for i, q in enumerate(queues):
                self._put(q, _END, threads[i])
            for t in threads:
                t.join(self.timeout_s)
        staying = self._staying()
        for i, err in enumerate(errors):
            if err is not None and i in staying:
                raise err
        missing = [i for i, a in enumerate(acks) if a is None and i in staying]
        if missing:
            raise FanoutError(missing[0], self.clients[missing[0]].address,
                              grpc.StatusCode.DEADLINE_EXCEEDED, "no acknowledgement within the deadline")
        return [a for a in acks if a is not None]

    def _staying(self) -> set[int]:
        """Indices of ``self.clients`` still members now (a drained instance left while the version was on its way)."""
        now = {id(c) for c in self.members()}
        return {i for i, c in enumerate(self.clients) if id(c) in now}

    def pull(self, version: int, wait_s: float) -> list[pb.UpdateAck]:
        """Tell every instance to pull ``version`` (-1 = latest) from its relay; return their acks."""
        with self.lock:
            self.clients = self.members()
            acks = self._pull(version, wait_s)
            self.last_pull, self.last_push = min(a.version for a in acks), None
            self._staged(acks)
            return acks

    def _staged(self, acks: list[pb.UpdateAck]) -> None:
        """Every member still a member acknowledged (a failure raised before this): tell ``on_staged``."""
        if self.on_staged is not None and acks:
            self.on_staged(self.clients, min(a.version for a in acks))

    def _pull(self, version: int, wait_s: float) -> list[pb.UpdateAck]:

        def one(i: int) -> pb.UpdateAck | FanoutError:
            client = self.clients[i]
            try:
                return client.pull_weights(version, wait_s=wait_s)
            except grpc.RpcError as err:
                return FanoutError(i, client.address, err.code(), err.details() or str(err))

        with ThreadPoolExecutor(max_workers=len(self.clients), thread_name_prefix="fanout-pull") as pool:
            replies = list(pool.map(one, range(len(self.clients))))
        staying = self._staying()
        for i, reply in enumerate(replies):
            if isinstance(reply, FanoutError) and i in staying:
                raise reply
        return [r for r in replies if not isinstance(r, FanoutError)]

    @staticmethod
    def _put(q: queue.Queue, item: object, thread: threading.Thread) -> None:
        while thread.is_alive():  # a failed forwarder stops consuming: skip it
            try:
                q.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def _forward(self, i: int, q: queue.Queue, acks: list, errors: list) -> None:
        def stream() -> Iterator[pb.WeightChunk]:
            while True:
                item = q.get()
                if item is _END:
                    return
                yield item

        client = self.clients[i]
        try:
            acks[i] = push_chunks(client, stream(), self.timeout_s)
        except grpc.RpcError as err:
            errors[i] = FanoutError(i, client.address, err.code(), err.details() or str(err))


def _recording(chunks: Iterable[pb.WeightChunk], kept: list[pb.WeightChunk] | None) -> Iterator[pb.WeightChunk]:
    for chunk in chunks:
        if kept is not None:
            kept.append(chunk)
        yield chunk
