"""A background sender of the newest version: the trainer never waits for a slow receiver.

Both the trainer's per-instance ``WeightPusher`` (``services.rollout.publisher``) and the relay
transport's push to the master relay (``services.run.transport``) hand versions to a
thread that sends them one at a time, always the newest offered: a version superseded before
it was sent is skipped (``on_drop`` lets the owner free it), so a slow link costs staleness,
never trainer time (Laminar §4, StaleFlow's parameter server). The first failure stops the
thread and is kept in ``error`` for the owner to raise on its own thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class NewestSender(Generic[T]):
    def __init__(
        self, send: Callable[[int, T], None], *, name: str, on_drop: Callable[[T], None] | None = None,
        after_send: Callable[[int, T], None] | None = None,
    ) -> None:
        """``send(version, item)`` runs on the sender thread; ``after_send`` after ``sent`` moved
        on (e.g. prepare the next buffer); ``on_drop(item)`` for an item superseded unsent."""
        self._send = send
        self._on_drop = on_drop
        self._after_send = after_send
        self.cond = threading.Condition()
        self._next: tuple[int, T] | None = None
        self._closed = False
        self.error: BaseException | None = None
        self.offered = 0  # newest version handed over
        self.sent = 0  # newest version sent
        self._taken = 0  # newest version the thread took to send (sent, or being sent)
        self.seconds: dict[int, float] = {}  # per version, time in ``send``
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def offer(self, version: int, item: T) -> None:
        """Hand a version over; it replaces an older one not yet sent. A version not newer than one
        sent, being sent or waiting is dropped (``on_drop``): a receiver refuses a version it already has."""
        with self.cond:
            self.offered = max(self.offered, version)
            stale = version <= self._taken or (self._next is not None and version <= self._next[0])
            dropped, self._next = (item, self._next) if stale else (self._next[1] if self._next else None,
                                                                     (version, item))
            self.cond.notify_all()
        if dropped is not None and self._on_drop is not None:
            self._on_drop(dropped)

    def wait_sent(self, version: int, timeout_s: float | None = None, what: str = "weight version") -> int:
        """Block until ``version`` or newer was sent; returns the newest sent. Raises the
        sender's error (``RuntimeError``) or ``TimeoutError``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self.cond:
            while self.sent < version:
                if self.error is not None:
                    raise RuntimeError(f"sending failed: {self.error}") from self.error
                remaining = 0.5 if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{what} {version} not sent within {timeout_s}s")
                self.cond.wait(min(remaining, 0.5))
            return self.sent

    def close(self, timeout_s: float = 60.0) -> None:
        with self.cond:
            self._closed = True
            self.cond.notify_all()
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while True:
            with self.cond:
                while self._next is None and not self._closed:
                    self.cond.wait()
                if self._next is None:
                    return
                version, item = self._next
                self._next = None
                self._taken = version
            try:
                t0 = time.perf_counter()
                self._send(version, item)
                self.seconds[version] = time.perf_counter() - t0
            except BaseException as exc:  # noqa: BLE001 - kept for the owner's thread to raise
                with self.cond:
                    self.error = exc
                    self.cond.notify_all()
                return
            with self.cond:
                self.sent = max(self.sent, version)
                self.cond.notify_all()
            if self._after_send is not None:
                self._after_send(version, item)
