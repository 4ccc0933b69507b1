"""WeightPublisher on the run's fleet table: a failed push loses its row at once, on the pusher's own
thread, before the pusher's error shows; ``offer`` and ``wait`` go to the rows that hold work, so an
offer from the learner thread or the end-of-run wait that races a loss neither raises nor waits for
the lost instance (the bugs 762fbe1 and 642b718 patched in the publisher); a failure seen in an
earlier incarnation does not lose the next one. Without the table, or where failures are fatal, a
failed push ends the run."""

from __future__ import annotations

import threading
import time

import pytest

from services.rollout.fleet import Fleet, fleet_of
from services.rollout.publisher import WeightPublisher


class Transport:
    """Delivers to every client but ``gone`` (its deliveries raise, as a refused connection does); a
    delivery to ``gone`` first waits for ``gate`` when one is set."""

    def __init__(self, gone: str, gate: threading.Event | None = None) -> None:
        self.gone, self.gate = gone, gate
        self.delivered: dict[str, list[int]] = {}
        self.entered = threading.Event()  # a delivery to ``gone`` began

    def deliver(self, client, version: int, snap) -> None:
        if client == self.gone:
            self.entered.set()
            if self.gate is not None:
                self.gate.wait()
            raise ConnectionError(f"{client}: connection refused")
        self.delivered.setdefault(client, []).append(version)

    def raise_if_failed(self) -> None:
        pass

    def close(self) -> None:
        pass


def _on_table(transport: Transport, fleet: Fleet | None = None) -> WeightPublisher:
    fleet = fleet or fleet_of(["a", "b"], 8)
    publisher = WeightPublisher(["a", "b"], 1 << 20, transport, fleet=fleet)
    publisher.push_errors_fatal = False  # the workflows that survive lost instances
    return publisher


def _until(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_a_failed_push_loses_its_row_before_its_error_shows_and_is_neither_offered_nor_waited_for():
    transport = Transport(gone="b")
    publisher = _on_table(transport)
    try:
        publisher.offer(1, object())
        _until(lambda: publisher.pushers[1].error is not None)
        row = publisher.fleet.snapshot()[1]  # read after the error: the loss is there already
        assert row.state == "lost" and "weight push failed" in row.why and "refused" in row.why
        assert publisher.fleet.losses == 1
        assert not publisher.offer_to(1, 2, object())  # a lost row is not offered to
        publisher.offer(2, object())  # the learner thread's offer: nothing raised
        publisher.wait(2, 30)  # the end of the run waits for the live instance only
        assert transport.delivered == {"a": [1, 2]}
        assert [r.version for r in publisher.fleet.snapshot().rows] == [2, 1]  # 2 recorded on the live row only
    finally:
        publisher.close()


class RacingFleet(Fleet):
    """The learner thread's ``at``-th read of the table sees the row live; right after it, before the
    learner acts on it, the push to that instance fails."""

    def __init__(self, gate: threading.Event, at: int) -> None:
        super().__init__(8)
        self.gate, self.at, self.learner, self.publisher = gate, at, None, None

    def snapshot(self):
        snap = super().snapshot()
        if threading.current_thread() is self.learner:
            self.at -= 1
            if self.at == 0:
                self.gate.set()  # b's delivery fails now
                _until(lambda: self.publisher.pushers[1].error is not None)
        return snap


@pytest.mark.parametrize("at", range(1, 7))  # the failure lands after each of the learner's reads in turn
def test_an_offer_from_the_learner_thread_racing_a_failing_push_neither_raises_nor_waits_forever(at):
    gate = threading.Event()
    transport = Transport(gone="b", gate=gate)
    fleet = RacingFleet(gate, at)
    for address in ("a", "b"):
        fleet.join(address, live=True, version=0)
    publisher = _on_table(transport, fleet)
    fleet.publisher = publisher
    try:
        publisher.offer(1, object())
        assert transport.entered.wait(10)  # b's push is under way (it will fail)
        errors: list[BaseException] = []

        def learner() -> None:  # runtime.step_and_snapshot's offer on an agentic step
            try:
                publisher.offer(2, object())
                publisher.wait(2, 30)  # then the end of the run
            except BaseException as exc:  # noqa: BLE001 - the assertion below names it
                errors.append(exc)

        thread = threading.Thread(target=learner, name="learner")
        fleet.learner = thread
        t0 = time.monotonic()
        thread.start()
        thread.join(20)
        assert not thread.is_alive() and errors == [] and time.monotonic() - t0 < 10
        assert fleet.at <= 0  # the failure did land while the learner offered or waited
        offered = 2 if at > 3 else 1  # reads 1-3 are the offer's (then 2 is not recorded on b), 4-6 the wait's
        assert fleet.snapshot()[1].state == "lost" and fleet.snapshot()[1].version == offered
        assert fleet.snapshot()[0].version == 2 and transport.delivered["a"][-1] == 2
    finally:
        gate.set()
        publisher.close()


def test_wait_stops_waiting_for_an_instance_another_thread_loses():
    gate = threading.Event()  # never set while waiting: b's push hangs, as on a dead host
    publisher = _on_table(Transport(gone="b", gate=gate))
    try:
        publisher.offer(1, object())
        timer = threading.Timer(0.3, lambda: publisher.fleet.mark_lost(1, "call UNAVAILABLE"))  # the rollout
        timer.start()
        t0 = time.monotonic()
        publisher.wait(1, 30)
        assert time.monotonic() - t0 < 5
        timer.join()
    finally:
        gate.set()
        publisher.close()


def test_a_push_that_failed_in_an_earlier_incarnation_does_not_lose_the_next_one():
    gate = threading.Event()
    publisher = _on_table(Transport(gone="b", gate=gate))
    fleet = publisher.fleet
    try:
        publisher.offer(1, object())
        assert publisher.pushers[1] and publisher._row(1).state == "live"
        _until(lambda: publisher.transport.entered.is_set())  # the delivery began in epoch 0
        fleet.mark_lost(1, "call UNAVAILABLE")
        fleet.mark_live(1, 1)  # readmitted (its new pusher staged version 1)
        gate.set()
        _until(lambda: publisher.pushers[1].error is not None)
        assert fleet.snapshot()[1].state == "live" and fleet.losses == 1
    finally:
        publisher.close()


def test_a_failed_push_ends_the_run_where_failures_are_fatal_or_there_is_no_table():
    for fleet in (fleet_of(["a", "b"], 8), None):
        publisher = WeightPublisher(["a", "b"], 1 << 20, Transport(gone="b"), fleet=fleet)
        publisher.push_errors_fatal = fleet is not None  # without a table, failures are fatal either way
        try:
            publisher.offer(1, object())
            with pytest.raises(RuntimeError, match="connection refused"):
                publisher.pushers[1].wait(1, 30)
            with pytest.raises(RuntimeError, match="weight push failed"):
                publisher.offer(2, object())
            with pytest.raises(RuntimeError, match="weight push failed"):
                publisher.wait(1, 30)
            if fleet is not None:
                assert fleet.snapshot()[1].state == "live"  # fatal: the run ends, the table is not touched
        finally:
            publisher.close()
