"""The orchestrator's collect step: ``lifecycle.drain`` with and without a time budget."""

from __future__ import annotations

import queue

from services.rollout.lifecycle import drain


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _refilling(clock: _Clock, per_event_s: float, handled: list[int]):
    """A handler that takes ``per_event_s`` and queues one more event each time (streams never pause)."""
    q: queue.Queue = queue.Queue()

    def handle(event: tuple) -> None:
        handled.append(event[0])
        clock.t += per_event_s
        q.put((event[0] + 1,))

    q.put((0,))
    return q, handle


def test_without_a_budget_every_queued_event_is_handled():
    q: queue.Queue = queue.Queue()
    for i in range(5):
        q.put((i,))
    seen: list[int] = []
    drain(q, 0.0, lambda e: seen.append(e[0]))
    assert seen == [0, 1, 2, 3, 4] and q.empty()


def test_a_budget_ends_the_drain_of_a_queue_that_keeps_refilling():
    clock, handled = _Clock(), []
    q, handle = _refilling(clock, 0.01, handled)
    drain(q, 0.0, handle, budget_s=0.05, clock=clock)
    assert handled == [0, 1, 2, 3, 4]  # 5 x 10 ms reach the 50 ms budget
    assert q.get_nowait() == (5,)  # the rest waits, in order, for the next call


def test_a_budget_still_handles_the_first_event_and_stops_on_an_empty_queue():
    clock, seen = _Clock(), []
    q: queue.Queue = queue.Queue()
    q.put((7,))
    drain(q, 0.0, lambda e: seen.append(e[0]), budget_s=0.0, clock=clock)
    assert seen == [7]
    drain(q, 0.0, lambda e: seen.append(e[0]), budget_s=1.0, clock=clock)  # nothing queued: returns at once
    assert seen == [7]
