"""Weight fan-out while the router's membership changes (a scale-in racing a weight version).

A draining instance can hold a request that waits for the very version being fanned out (one-step
asks for version v right after v's push started); the version must still reach it, or the request
and the drain wait forever. Once drained and stopped, its failure is not the version's.
"""

from __future__ import annotations

import grpc
import pytest

from services.common.config import load_config
from services.generation.fanout import FanoutError, WeightFanout
from services.generation.router import RouterCore
from services.generation.router_members import MembershipError
from services.proto import braid_pb2 as pb
from tests.conftest import ROOT


class _Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection refused"


class FakeInstance:
    def __init__(self, address: str, on_pull=None) -> None:
        self.address = address
        self.on_pull = on_pull
        self.pulled: list[int] = []

    def pull_weights(self, version: int, wait_s: float) -> pb.UpdateAck:
        if self.on_pull is not None:
            self.on_pull()
        self.pulled.append(version)
        return pb.UpdateAck(version=version, staged=True)


def _core(*addresses: str) -> RouterCore:
    cfg = load_config(ROOT / "deploy/configs/smoke.yaml").generation
    return RouterCore([FakeInstance(a) for a in addresses], cfg)


def test_a_draining_instance_still_gets_new_versions_until_it_is_drained():
    core = _core("a:1", "b:2")
    members = core.members
    held = core.fleet.reserve(1, 1, over=True)  # b holds one sequence (e.g. waiting for the next version)
    with pytest.raises(MembershipError) as err:
        members.remove_instance("b:2", timeout_s=0.01)
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert members.addresses() == ["a:1"] and core.fleet.live() == [0]  # no new work for b
    assert [c.address for c in members.weight_clients()] == ["a:1", "b:2"]  # but the next version, yes
    fanout = WeightFanout(members.weight_clients, on_staged=members.staged)
    assert [a.version for a in fanout.pull(5, wait_s=1.0)] == [5, 5]
    assert [r.staged for r in core.fleet.snapshot().rows] == [5, 5]
    core.fleet.release(held)  # its last sequence came back
    assert [c.address for c in members.weight_clients()] == ["a:1"]
    fanout.pull(6, wait_s=1.0)
    assert core.clients[1].pulled == [5]
    assert members.remove_instance("b:2", timeout_s=0.01) == 0  # the removal, retried, finishes
    assert [r.state for r in core.fleet.snapshot().rows] == ["live", "removed"]


def test_an_instance_that_left_while_the_version_was_on_its_way_does_not_fail_it():
    members: list = []

    def leave_and_die():
        members.remove(gone)  # drained and stopped by the scale-out controller meanwhile
        raise _Unavailable()

    stays, gone = FakeInstance("a:1"), FakeInstance("b:2", on_pull=leave_and_die)
    members += [stays, gone]
    acks = WeightFanout(lambda: list(members)).pull(3, wait_s=1.0)
    assert [a.version for a in acks] == [3]


def test_a_member_that_fails_still_fails_the_version():
    def die():
        raise _Unavailable()

    fanout = WeightFanout([FakeInstance("a:1"), FakeInstance("b:2", on_pull=die)])
    with pytest.raises(FanoutError) as err:
        fanout.pull(3, wait_s=1.0)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE and "b:2" in str(err.value)
