"""The newest-version background sender shared by the trainer's pushers and the relay transport."""

from __future__ import annotations

import threading
import time

import pytest

from services.common.newest import NewestSender


def _until(predicate, timeout_s: float = 10.0) -> None:
    """Poll (the sender does not notify for every state change a test looks at)."""
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_version_superseded_before_it_was_sent_is_dropped():
    gate, sent, dropped, after = threading.Event(), [], [], []

    def send(version: int, item: str) -> None:
        gate.wait(10)
        sent.append((version, item))

    s = NewestSender(send, name="t", on_drop=dropped.append, after_send=lambda v, i: after.append(v))
    try:
        s.offer(1, "a")
        _until(lambda: s._next is None)  # the thread took version 1
        s.offer(2, "b")
        s.offer(3, "c")  # replaces 2, not yet sent
        s.offer(2, "late")  # older than what is waiting: dropped (its owner frees it), never sent
        gate.set()
        assert s.wait_sent(3, 10) == 3
        assert sent == [(1, "a"), (3, "c")] and dropped == ["b", "late"] and s.offered == 3
        assert set(s.seconds) == {1, 3}
        _until(lambda: len(after) == 2)
        assert after == [1, 3]
    finally:
        s.close()


def test_the_first_failure_stops_the_sender_and_is_raised_to_waiters():
    def send(version: int, item: object) -> None:
        raise ConnectionError(f"relay gone at {version}")

    s = NewestSender(send, name="t")
    s.offer(1, None)
    with pytest.raises(RuntimeError, match="relay gone at 1"):
        s.wait_sent(1, 10)
    assert isinstance(s.error, ConnectionError)
    with pytest.raises(TimeoutError):
        NewestSender(lambda v, i: None, name="idle").wait_sent(1, 0.1)
    s.close()


def test_a_version_already_sent_or_being_sent_is_dropped_not_sent_again():
    import threading

    from services.common.newest import NewestSender

    sent, dropped, gate, taken = [], [], threading.Event(), threading.Event()

    def send(version, item):
        taken.set()
        gate.wait(5)
        sent.append(version)

    s = NewestSender(send, name="t", on_drop=dropped.append)
    s.offer(1, "a")
    assert taken.wait(5)
    s.offer(1, "again")  # 1 is being sent (the thread took it): a receiver would refuse it twice
    gate.set()
    s.wait_sent(1, timeout_s=5)
    s.offer(1, "late")  # already sent
    s.offer(2, "b")
    s.wait_sent(2, timeout_s=5)
    gate.clear()
    taken.clear()
    s.offer(3, "c")
    assert taken.wait(5)
    s.offer(4, "d")
    s.offer(4, "d again")  # 4 waits behind 3: the same version again is dropped, not leaked
    gate.set()
    s.wait_sent(4, timeout_s=5)
    s.close()
    assert sent == [1, 2, 3, 4] and dropped == ["again", "late", "d again"]
