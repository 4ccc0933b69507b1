"""Readmission of a lost SGS instance: probed at most every interval, readmitted only once the
newest version is staged there, probed again when its new pusher fails."""

from __future__ import annotations

import grpc

from services.rollout.readmit import Readmission


class Down(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE


class Client:
    def __init__(self) -> None:
        self.up, self.probes = False, 0

    def health(self, timeout_s: float):
        self.probes += 1
        if not self.up:
            raise Down()


class Pusher:
    def __init__(self) -> None:
        self.offers, self.published, self.error = [], 0, None

    def offer(self, version, snap) -> None:
        self.offers.append(version)


class Publisher:
    def __init__(self, n: int) -> None:
        self.clients = [Client() for _ in range(n)]
        self.pushers = [Pusher() for _ in range(n)]

    def renew(self, i: int) -> Pusher:
        self.pushers[i] = Pusher()
        return self.pushers[i]


def test_a_restarted_instance_is_readmitted_once_it_has_the_newest_weights():
    now = [0.0]
    pub = Publisher(2)
    r = Readmission(pub, interval_s=1.0, clock=lambda: now[0])
    assert r.poll([1], (4, "snap")) == [] and pub.clients[1].probes == 1
    assert r.poll([1], (4, "snap")) == [] and pub.clients[1].probes == 1  # not again within the interval
    pub.clients[1].up = True
    now[0] = 1.5
    assert r.poll([1], (4, "snap")) == [] and pub.pushers[1].offers == [4]  # offered, not staged yet
    pub.pushers[1].published = 4
    assert r.poll([1], (5, "snap")) == [1] and r.pending == {}


def test_the_first_weights_need_no_push_and_a_failed_push_is_probed_again():
    now = [0.0]
    pub = Publisher(1)
    pub.clients[0].up = True
    r = Readmission(pub, interval_s=1.0, clock=lambda: now[0])
    assert r.poll([0], (0, None)) == [0] and pub.pushers[0].offers == []  # it loaded version 0 at start
    now[0] = 1.0  # lost again later
    assert r.poll([0], (3, "snap")) == [] and r.pending == {0: 3}
    pub.pushers[0].error = RuntimeError("gone again")
    assert r.poll([0], (3, "snap")) == [] and r.pending == {}
    now[0] = 2.5
    r.poll([0], (3, "snap"))
    assert pub.clients[0].probes == 3 and r.pending == {0: 3}
