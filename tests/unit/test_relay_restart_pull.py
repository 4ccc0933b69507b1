"""An instance whose relay is restarting is retried; a dead instance or another error is not."""

from __future__ import annotations

import grpc
import pytest

from services.run import transport


class _Err(grpc.RpcError):
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return f"relay: {self._code.name}"


class _Client:
    address = "sgs:1"

    def __init__(self, pulls, healthy=True):
        self.pulls = list(pulls)  # what each pull does: an exception or None (success)
        self.healthy = healthy
        self.calls = 0

    def pull_weights(self, version, *, wait_s):
        self.calls += 1
        outcome = self.pulls.pop(0)
        if outcome is not None:
            raise outcome

    def health(self):
        if not self.healthy:
            raise _Err(grpc.StatusCode.UNAVAILABLE)


@pytest.fixture(autouse=True)
def _no_sleep(monkeypatch):
    monkeypatch.setattr(transport.time, "sleep", lambda s: None)


def test_unavailable_relay_behind_a_live_instance_is_retried():
    c = _Client([_Err(grpc.StatusCode.UNAVAILABLE), _Err(grpc.StatusCode.UNAVAILABLE), None])
    transport._pull_through_relay_restart(c, 5, 1.0)
    assert c.calls == 3


def test_a_dead_instance_or_another_error_goes_up_at_once():
    dead = _Client([_Err(grpc.StatusCode.UNAVAILABLE), None], healthy=False)
    with pytest.raises(grpc.RpcError):
        transport._pull_through_relay_restart(dead, 5, 1.0)
    assert dead.calls == 1
    refused = _Client([_Err(grpc.StatusCode.DATA_LOSS), None])
    with pytest.raises(grpc.RpcError):
        transport._pull_through_relay_restart(refused, 5, 1.0)
    assert refused.calls == 1


def test_retrying_stops_at_the_deadline(monkeypatch):
    monkeypatch.setattr(transport, "RELAY_DOWN_WAIT_S", -1.0)  # already past it
    c = _Client([_Err(grpc.StatusCode.UNAVAILABLE), None])
    with pytest.raises(grpc.RpcError):
        transport._pull_through_relay_restart(c, 5, 1.0)
