"""Clients of the reward service; they speak plain types and hide protobuf.

``RewardClient`` talks to one worker; every call has a deadline. ``RewardPool`` spreads scores
over many workers for many threads at once:

- **least loaded**: each call goes to the worker with the fewest calls in flight from this pool
  (ties: the one used least recently), so a slow worker gets fewer calls;
- **retries**: a call that fails with UNAVAILABLE (the worker is gone or stopping),
  DEADLINE_EXCEEDED (too slow) or RESOURCE_EXHAUSTED (its queue is full) is retried on another
  worker when there is one, up to ``retries`` times, after ``backoff_s`` doubled each time.
  Scoring is stateless and deterministic, so a retry is always safe. Any other status is the
  request's fault (INVALID_ARGUMENT: a bad or inconsistent transcript) and is raised at once;
- **never hangs**: each attempt has the deadline ``timeout_s``, so a call ends within
  ``(retries + 1) x timeout_s`` plus the backoffs;
- **membership**: with ``membership``, the pool follows a JSON file ``{"version": n, "workers":
  ["host:port", ...]}`` that the controller (``flows/reward_pool.py``) writes in ``start()`` (it
  must exist when the pool is built) and replaces atomically when a worker joins or leaves. Every
  call first checks the file (a ``stat``) and re-reads it when it changed: a new worker gets calls
  at once; a removed one gets no new calls, and its channel is closed when its last call in flight
  returns.

``RewardError(code, message, retryable)`` is what a failed call raises; ``code`` is a gRPC
status name.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from services.common.atomic import write_json_atomic
from services.common.reward_config import RewardConfig
from services.common.rpc import connect
from services.proto import braid_pb2 as pb
from services.proto import braid_pb2_grpc as pb_grpc
from services.reward.protocol import RewardRequest, RewardResult
from services.reward.server import MAX_MESSAGE_BYTES, request_to_pb
from services.reward.worker import WorkerHealth

RETRYABLE = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"})
HEALTH_TIMEOUT_S = 5.0


class RewardError(Exception):
    """A failed reward call: ``code`` (a gRPC status name) and whether retrying elsewhere may help."""

    def __init__(self, code: str, message: str, retryable: bool | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = code in RETRYABLE if retryable is None else retryable


def _call(fn, request, timeout_s: float):
    try:
        return fn(request, timeout=timeout_s)
    except grpc.RpcError as err:
        raise RewardError(err.code().name, err.details() or "") from None


class RewardClient:
    """One reward worker."""

    def __init__(self, address: str, *, timeout_s: float = 30.0) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel = connect(address, max_message_bytes=MAX_MESSAGE_BYTES)
        self._stub = pb_grpc.RewardStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def score(self, request: RewardRequest, *, timeout_s: float | None = None) -> RewardResult:
        r = _call(self._stub.Score, request_to_pb(request), timeout_s or self.timeout_s)
        return RewardResult(r.reward, r.kind, dict(r.info), r.worker, r.score_s)

    def health(self, timeout_s: float = HEALTH_TIMEOUT_S) -> WorkerHealth:
        h = _call(self._stub.Health, pb.HealthRequest(), timeout_s)
        return WorkerHealth(h.worker_id, h.kind, h.threads, h.in_flight, h.queued, h.served, h.busy_s, h.max_queue)

    def wait_ready(self, timeout_s: float = 30.0) -> WorkerHealth:
        """Poll Health until the worker answers (retrying only on UNAVAILABLE)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.health()
            except RewardError as err:
                if err.code != "UNAVAILABLE" or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


@dataclass
class _Member:
    client: RewardClient
    in_flight: int = 0
    last_used: int = 0
    removed: bool = False


def read_membership(path: Path) -> tuple[int, list[str]]:
    """(version, worker addresses) of a membership file; ``ValueError`` naming the file when it is malformed."""
    data = json.loads(path.read_text())
    if not (isinstance(data, dict) and isinstance(data.get("version"), int) and isinstance(data.get("workers"), list)
            and all(isinstance(a, str) for a in data["workers"])):
        raise ValueError(f'{path}: expected {{"version": <int>, "workers": ["host:port", ...]}}, got {str(data)[:200]}')
    return data["version"], list(data["workers"])


def write_membership(path: Path, version: int, workers: list[str]) -> None:
    """Replace ``path`` atomically (readers see the old file or the new one, never a part)."""
    write_json_atomic(path, {"version": version, "workers": workers})


class RewardPool:
    """Many reward workers behind one thread-safe ``score``; see the module docstring."""

    def __init__(self, addresses: list[str] | None = None, membership: Path | None = None, *, timeout_s: float = 30.0,
                 retries: int = 3, backoff_s: float = 0.05) -> None:
        if (addresses is None) == (membership is None):
            raise ValueError("RewardPool needs either addresses or a membership file, not both or neither")
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.membership = Path(membership) if membership is not None else None
        self._lock = threading.Lock()
        self._members: dict[str, _Member] = {}
        self._calls = 0
        self._stamp: tuple[int, int, int] | None = None  # (mtime_ns, size, inode) of the file last read
        self.version = 0
        self._set_members(list(addresses) if addresses is not None else [])
        self._refresh()

    @classmethod
    def from_config(cls, cfg: RewardConfig, addresses: list[str] | None = None,
                    membership: Path | None = None) -> RewardPool:
        """A pool with the ``reward`` section's timeout, retries and backoff."""
        return cls(addresses, membership, timeout_s=cfg.timeout_s, retries=cfg.retries, backoff_s=cfg.retry_backoff_s)

    def workers(self) -> list[str]:
        """The addresses that get new calls."""
        self._refresh()
        with self._lock:
            return [a for a, m in self._members.items() if not m.removed]

    def score(self, request: RewardRequest) -> RewardResult:
        """Score on the least-loaded worker, retrying retryable failures elsewhere; ``RewardError`` when done trying."""
        tried: set[str] = set()
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(delay)
                delay *= 2
            self._refresh()
            member = self._acquire(tried)
            if member is None:
                error = RewardError("UNAVAILABLE", "no reward workers in the pool"
                                    + (f" (membership {self.membership}, version {self.version})"
                                       if self.membership else ""))
                continue
            tried.add(member.client.address)
            try:
                return member.client.score(request, timeout_s=self.timeout_s)
            except RewardError as err:
                if not err.retryable:
                    raise
                error = RewardError(err.code, f"{member.client.address}: {err.message}")
            finally:
                self._release(member)
        raise RewardError(error.code, f"{error.message} (after {self.retries + 1} attempts)", retryable=error.retryable)

    def close(self) -> None:
        with self._lock:
            members, self._members = list(self._members.values()), {}
        for m in members:
            m.client.close()

    def _acquire(self, tried: set[str]) -> _Member | None:
        """The least-loaded live worker, preferring those this call has not tried; counts the call in."""
        with self._lock:
            live = [m for m in self._members.values() if not m.removed]
            fresh = [m for m in live if m.client.address not in tried] or live
            if not fresh:
                return None
            member = min(fresh, key=lambda m: (m.in_flight, m.last_used))
            self._calls += 1
            member.in_flight += 1
            member.last_used = self._calls
            return member

    def _release(self, member: _Member) -> None:
        with self._lock:
            member.in_flight -= 1
            done = member.removed and member.in_flight == 0
            if done and self._members.get(member.client.address) is member:
                del self._members[member.client.address]
        if done:
            member.client.close()

    def _refresh(self) -> None:
        """Re-read the membership file if it changed since the last read."""
        if self.membership is None:
            return
        st = os.stat(self.membership)
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return
        version, workers = read_membership(self.membership)
        with self._lock:
            self._stamp, self.version = stamp, version
        self._set_members(workers)

    def _set_members(self, addresses: list[str]) -> None:
        """Add the new addresses; mark the others removed (closed now if idle, else by their last call)."""
        idle = []
        with self._lock:
            for address in addresses:
                member = self._members.get(address)
                if member is None or member.removed:  # a removed one still finishing is replaced: it closes itself
                    self._members[address] = _Member(RewardClient(address, timeout_s=self.timeout_s))
            for address, member in list(self._members.items()):
                if address not in addresses:
                    member.removed = True
                    if member.in_flight == 0:
                        idle.append(self._members.pop(address))
        for member in idle:
            member.client.close()
