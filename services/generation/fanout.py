"""Weight fan-out of the SGS router: a version reaches every instance behind it.

Two paths, matching the weight transports (``services/weights/transport.py``):

- ``push`` (``direct``): one incoming version stream forwarded to every instance. Each instance
  gets its own forwarding thread fed through a bounded queue, so chunks flow to all instances
  as they arrive (nothing is buffered whole) and a slow instance applies backpressure;
- ``pull`` (``relay``): every instance is told, in parallel, to pull the version from its own
  local relay (``PullWeights``); no weight bytes pass through the router.

The version counts as staged when **every** instance acked; the first instance failure is
reported with its gRPC status and the instance named.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
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
    def __init__(self, clients: list[GenerationClient], timeout_s: float = 600) -> None:
        self.clients = clients
        self.timeout_s = timeout_s

    def push(self, chunks: Iterable[pb.WeightChunk]) -> list[pb.UpdateAck]:
        """Forward the stream to every instance; return their acks (raises ``FanoutError``)."""
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
        for err in errors:
            if err is not None:
                raise err
        if any(a is None for a in acks):
            raise FanoutError(acks.index(None), self.clients[acks.index(None)].address,
                              grpc.StatusCode.DEADLINE_EXCEEDED, "no acknowledgement within the deadline")
        return [a for a in acks if a is not None]

    def pull(self, version: int, wait_s: float) -> list[pb.UpdateAck]:
        """Tell every instance to pull ``version`` (-1 = latest) from its relay; return their acks."""

        def one(i: int) -> pb.UpdateAck:
            client = self.clients[i]
            try:
                return client.pull_weights(version, wait_s=wait_s)
            except grpc.RpcError as err:
                raise FanoutError(i, client.address, err.code(), err.details() or str(err)) from None

        with ThreadPoolExecutor(max_workers=len(self.clients), thread_name_prefix="fanout-pull") as pool:
            return list(pool.map(one, range(len(self.clients))))

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
