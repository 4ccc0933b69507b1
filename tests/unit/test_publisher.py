"""WeightPublisher: a lost instance's failed push ends the run only where failures are fatal."""

from __future__ import annotations

import pytest

from services.rollout.publisher import WeightPublisher


class Transport:
    """Delivers to every client but one that is gone (its deliveries raise, as a refused connection does)."""

    def __init__(self, gone: str) -> None:
        self.gone = gone
        self.delivered: dict[str, list[int]] = {}

    def deliver(self, client, version: int, snap) -> None:
        if client == self.gone:
            raise ConnectionError(f"{client}: connection refused")
        self.delivered.setdefault(client, []).append(version)

    def raise_if_failed(self) -> None:
        pass

    def close(self) -> None:
        pass


def _publisher(fatal: bool) -> tuple[WeightPublisher, Transport]:
    transport = Transport(gone="b")
    publisher = WeightPublisher(["a", "b"], 1 << 20, transport)
    publisher.push_errors_fatal = fatal
    publisher.offer(1, object())
    publisher.pushers[0].wait(1, 30)
    with pytest.raises(RuntimeError, match="connection refused"):
        publisher.pushers[1].wait(1, 30)  # b's push thread failed
    return publisher, transport


def test_a_lost_instance_is_passed_over_when_the_workflow_survives_lost_instances():
    publisher, transport = _publisher(fatal=False)
    try:
        publisher.offer(2, object())  # the agentic runner offers the next version before its tick saw b go
        publisher.pushers[0].wait(2, 30)
        assert transport.delivered == {"a": [1, 2]}
        assert publisher.pushers[1].error is not None  # left for the workflow to find and lose the instance
        publisher.wait(2, 30)  # the end of the run waits for the live instances only
    finally:
        publisher.close()


def test_a_failed_push_ends_the_run_where_failures_are_fatal():
    publisher, _ = _publisher(fatal=True)
    try:
        with pytest.raises(RuntimeError, match="weight push failed"):
            publisher.offer(2, object())
        with pytest.raises(RuntimeError, match="weight push failed"):
            publisher.wait(1, 30)
    finally:
        publisher.close()
