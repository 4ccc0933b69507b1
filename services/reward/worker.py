"""The reward worker's mechanism: admission, a bounded queue, injected latency, timeouts, counters.

Behind the Reward service (``server.py`` maps its errors to gRPC statuses). A request is checked
(``protocol.check_request``: INVALID_ARGUMENT), then admitted if fewer than ``threads +
max_queue`` requests are in flight (else RESOURCE_EXHAUSTED), then runs on the worker's pool of
``reward.threads`` scoring threads: it sleeps its injected latency (``reward.latency``, drawn
from a sampler seeded by the config's seed and the request id, so a request's delay is the same
on whichever worker serves it) and calls the reward function. The caller's thread waits at most
``reward.timeout_s`` from arrival, queueing included (DEADLINE_EXCEEDED); the latency sleep
itself never outlasts that budget. A scoring call that overruns keeps its thread until it
returns, and counts as busy meanwhile.

Counters for the pool scaler (``Health``): requests in flight (queued + scoring), queued,
served, and cumulative busy thread-seconds (finished calls plus the running ones so far), whose
growth over an interval divided by ``interval x threads`` is the worker's utilisation.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import CancelledError, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from services.agentic.latency import LatencySampler
from services.common.reward_config import RewardConfig
from services.reward.protocol import InvalidRequest, RewardFunction, RewardRequest, RewardResult, check_request


class RewardRequestError(Exception):
    """A request the worker refuses or fails; ``code`` names the gRPC status."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class WorkerHealth:
    worker_id: str
    kind: str
    threads: int
    in_flight: int  # admitted, not yet answered (queued + scoring)
    queued: int  # admitted, waiting for a scoring thread
    served: int  # answered with a score
    busy_s: float  # cumulative thread-seconds of scoring (latency included)
    max_queue: int


class RewardWorker:
    def __init__(self, cfg: RewardConfig, fn: RewardFunction, worker_id: str = "", *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.fn = fn
        self.worker_id = worker_id
        self._clock = clock
        self._stopping = threading.Event()
        self._mutex = threading.Lock()
        self._in_flight = 0
        self._served = 0
        self._busy_done = 0.0
        self._running: dict[int, float] = {}  # scoring thread id -> when its call started
        self._pool = ThreadPoolExecutor(max_workers=cfg.threads, thread_name_prefix="reward-score")
        self._tasks: tuple[str, ...] = tuple(getattr(fn, "extra_tasks", ()))  # a run's dataset tasks

    def score(self, request: RewardRequest) -> RewardResult:
        arrived = self._clock()
        try:
            check_request(request, self._tasks)
        except InvalidRequest as err:
            raise RewardRequestError("INVALID_ARGUMENT", str(err)) from None
        self._admit()
        try:
            delay = LatencySampler(self.cfg.latency, zlib.crc32(request.request_id.encode())).sample()
            try:
                future = self._pool.submit(self._run, request, delay, arrived)
            except RuntimeError:  # shutdown() came between admission and here
                if not self._stopping.is_set():
                    raise
                raise RewardRequestError("UNAVAILABLE", f"worker {self.worker_id} is stopping") from None
            try:
                scored = future.result(timeout=max(0.0, self.cfg.timeout_s - (self._clock() - arrived)))
            except FutureTimeout:
                future.cancel()  # still queued: it never runs
                raise RewardRequestError("DEADLINE_EXCEEDED", f"scoring took longer than reward.timeout_s "
                                         f"({self.cfg.timeout_s}s) on worker {self.worker_id}") from None
            except CancelledError:  # shutdown() dropped it from the queue
                raise RewardRequestError("UNAVAILABLE", f"worker {self.worker_id} is stopping") from None
            except InvalidRequest as err:
                raise RewardRequestError("INVALID_ARGUMENT", str(err)) from None
            except RewardRequestError:
                raise
            except Exception as err:  # a bug of the reward function: this request only, reported to its caller
                raise RewardRequestError(
                    "INTERNAL", f"reward kind {self.fn.kind!r} failed: {type(err).__name__}: {err}"
                ) from err
        finally:
            with self._mutex:
                self._in_flight -= 1
        with self._mutex:
            self._served += 1
        return RewardResult(scored.reward, self.fn.kind, dict(scored.info), self.worker_id, self._clock() - arrived)

    def _admit(self) -> None:
        limit = self.cfg.threads + self.cfg.max_queue
        with self._mutex:
            if self._stopping.is_set():
                raise RewardRequestError("UNAVAILABLE", f"worker {self.worker_id} is stopping")
            if self._in_flight >= limit:
                raise RewardRequestError("RESOURCE_EXHAUSTED",
                                         f"worker {self.worker_id} holds {self._in_flight} requests "
                                         f"({self.cfg.threads} scoring, reward.max_queue {self.cfg.max_queue} queued)")
            self._in_flight += 1

    def _run(self, request: RewardRequest, delay: float, arrived: float):
        """On a scoring thread: the injected latency, then the reward function."""
        started = self._clock()
        me = threading.get_ident()
        with self._mutex:
            self._running[me] = started
        try:
            budget = self.cfg.timeout_s - (started - arrived)
            self._stopping.wait(max(0.0, min(delay, budget)))  # interrupted by shutdown()
            if self._stopping.is_set():
                raise RewardRequestError("UNAVAILABLE", f"worker {self.worker_id} is stopping")
            if delay >= budget:
                raise RewardRequestError("DEADLINE_EXCEEDED", f"scoring took longer than reward.timeout_s "
                                         f"({self.cfg.timeout_s}s) on worker {self.worker_id} (injected latency "
                                         f"{delay:.3f}s)")
            return self.fn.score(request)
        finally:
            with self._mutex:
                del self._running[me]
                self._busy_done += self._clock() - started

    def health(self) -> WorkerHealth:
        now = self._clock()
        with self._mutex:
            running = len(self._running)
            busy = self._busy_done + sum(now - t for t in self._running.values())
            return WorkerHealth(self.worker_id, self.fn.kind, self.cfg.threads, self._in_flight,
                                max(0, self._in_flight - running), self._served, busy, self.cfg.max_queue)

    def shutdown(self) -> None:
        """Refuse new requests (UNAVAILABLE), cut injected sleeps short, drop queued calls."""
        self._stopping.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
