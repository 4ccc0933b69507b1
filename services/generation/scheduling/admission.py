"""Admission order inside one instance: FCFS or LPT (StreamRL §5.3 "Scheduling Order").

When an instance holds more sequences than it can run at once (the batch size is bounded by
``max_inflight`` and by KV-cache memory), the order in which waiting sequences enter the
engine decides the makespan. That is P||Cmax with the batch slots as machines, and StreamRL
uses Graham's LPT rule (longest processing time first; a 4/3 - 1/(3m) approximation): start
the sequences in descending estimated length, and whenever one finishes, admit the longest
one still waiting.

``AdmissionQueue`` is that rule as a data structure, used by the live SGS core and by the
simulator alike:

- ``order="lpt"``: descending estimate. A sequence with **no estimate** goes first (in
  arrival order): it may be long, and starting it early bounds the damage — so a request
  without any estimates is served FCFS.
- ``order="fcfs"``: arrival order.
- ``push(item, resumed=True)`` (a preempted or interrupted sequence coming back) goes ahead
  of everything: it already holds work and, under LPT, was started because it was long.

``pop(limit, eligible)`` returns up to ``limit`` items in order, skipping (and keeping) those
``eligible`` rejects (e.g. waiting for a weight version). Pure: no clock, no I/O.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from typing import Generic, Literal, TypeVar

T = TypeVar("T")
Order = Literal["fcfs", "lpt"]
ORDERS: tuple[str, ...] = ("fcfs", "lpt")

_RESUMED, _UNKNOWN, _KNOWN = 0, 1, 2


class AdmissionQueue(Generic[T]):
    def __init__(self, order: Order, estimate: Callable[[T], float | None]) -> None:
        if order not in ORDERS:
            raise ValueError(f"admission order must be one of {ORDERS}, got {order!r}")
        self.order = order
        self._estimate = estimate
        self._heap: list[tuple[int, float, int, T]] = []
        self._counter = itertools.count()

    def _key(self, item: T, resumed: bool) -> tuple[int, float]:
        if resumed:
            return _RESUMED, 0.0
        if self.order == "fcfs":
            return _KNOWN, 0.0
        est = self._estimate(item)
        if est is None:
            return _UNKNOWN, 0.0
        return _KNOWN, -float(est)

    def push(self, item: T, *, resumed: bool = False) -> None:
        group, neg = self._key(item, resumed)
        heapq.heappush(self._heap, (group, neg, next(self._counter), item))

    def extend(self, items: list[T]) -> None:
        for item in items:
            self.push(item)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[T]:
        """Items in admission order (a sorted copy; the queue is unchanged)."""
        return (entry[3] for entry in sorted(self._heap))

    def peek(self) -> T | None:
        return self._heap[0][3] if self._heap else None

    def pop(self, limit: int = 1, eligible: Callable[[T], bool] | None = None) -> list[T]:
        """Up to ``limit`` items in admission order; ineligible ones stay queued in place."""
        taken: list[T] = []
        skipped: list[tuple[int, float, int, T]] = []
        while self._heap and len(taken) < limit:
            entry = heapq.heappop(self._heap)
            if eligible is None or eligible(entry[3]):
                taken.append(entry[3])
            else:
                skipped.append(entry)
        for entry in skipped:
            heapq.heappush(self._heap, entry)
        return taken

    def remove_if(self, pred: Callable[[T], bool]) -> list[T]:
        """Drop and return every queued item ``pred`` accepts (e.g. a cancelled call's)."""
        removed = [e[3] for e in self._heap if pred(e[3])]
        if removed:
            self._heap = [e for e in self._heap if not pred(e[3])]
            heapq.heapify(self._heap)
        return removed
