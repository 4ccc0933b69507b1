"""FleetKeeper (services.rollout.keeper) drives the fleet table: an instance that joins through the
membership file gets a joining row and is live once it has the newest weights; a leaving one drains
(no new work), is removed and acknowledged once it holds nothing; a lost one that answers again is
readmitted at the version its pusher was offered, and a leaving one is not."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

from services.rollout.fleet import Fleet
from services.rollout.keeper import FleetKeeper
from services.rollout.membership import ACK, MEMBERSHIP


class Client:
    def __init__(self, address: str) -> None:
        self.address = address

    def health(self, timeout_s: float) -> None:
        return None  # it answers


class Pusher:
    def __init__(self, offered: int = 0) -> None:
        self.offered = self.published = offered
        self.error = None

    def offer(self, version: int, snap) -> None:
        self.offered = self.published = version

    def close(self) -> None:
        pass


class Publisher:
    def __init__(self, clients) -> None:
        self.clients, self.pushers = list(clients), [Pusher() for _ in clients]

    def add(self, client) -> None:
        self.clients.append(client)
        self.pushers.append(Pusher())

    def renew(self, i: int) -> Pusher:
        self.pushers[i] = Pusher()
        return self.pushers[i]


def keeper(tmp_path, n: int = 2) -> FleetKeeper:
    clients = [Client(f"h:{k}") for k in range(n)]
    rt = SimpleNamespace(run_dir=tmp_path, clients=clients, publisher=Publisher(clients), connect=Client)
    fleet = Fleet(capacity=8)
    for c in clients:
        fleet.join(c.address, live=True, version=0)
    k = FleetKeeper(rt, fleet, Counter())
    k.readmission.interval_s = 0.0
    return k


def want(tmp_path, **states: str) -> None:
    doc = {"instances": [{"address": a.replace("_", ":"), "state": s} for a, s in states.items()]}
    (tmp_path / MEMBERSHIP).write_text(json.dumps(doc))


def acks(tmp_path) -> dict:
    return json.loads((tmp_path / ACK).read_text())


def test_a_joining_instance_gets_a_row_and_a_leaving_one_drains_before_it_is_acknowledged(tmp_path):
    k = keeper(tmp_path)
    held = k.fleet.reserve(1, 3)
    want(tmp_path, h_0="active", h_1="leaving", h_2="active")
    k.poll((4, object()))
    rows = k.fleet.snapshot()
    assert [r.state for r in rows.rows] == ["live", "draining", "live"]  # h:2 joined and took version 4
    assert rows[2].version == 4 and k.rt.clients[2].address == "h:2" and len(k.rt.publisher.pushers) == 3
    assert acks(tmp_path) == {"h:2": {"state": "joined", "version": 4}}
    assert k.fleet.acquire(None, lambda v: True, 8, eligible=[1]) is None  # a draining row takes nothing
    k.poll((4, object()))
    assert "h:1" not in acks(tmp_path)  # it still holds 3 samples
    k.fleet.release(held)
    k.poll((4, object()))
    assert k.fleet.snapshot()[1].state == "removed"
    assert acks(tmp_path)["h:1"] == {"state": "drained", "held": 3}
    assert k.counts == Counter(instances_joined=1, instances_left=1)


def test_a_lost_instance_is_readmitted_at_its_offered_version_unless_it_is_leaving(tmp_path):
    k = keeper(tmp_path, 3)
    assert k.lost(0, "UNAVAILABLE") and not k.lost(0, "again")  # a loss counts once
    k.lost(2, "UNAVAILABLE")
    want(tmp_path, h_0="active", h_1="active", h_2="leaving")
    k.poll((7, object()))
    rows = k.fleet.snapshot()
    assert (rows[0].state, rows[0].version, rows[0].epoch) == ("live", 7, 2)  # lost, then a new incarnation
    assert rows[2].state == "removed" and acks(tmp_path)["h:2"] == {"state": "drained", "held": 0}
    assert k.counts == Counter(instances_lost=2, instances_readmitted=1, instances_left=1)


def test_a_loss_marked_on_another_thread_is_noticed_once_and_handed_to_on_lost(tmp_path):
    """A weight pusher's thread (or the multi-turn generator's loop) marks the row; the keeper's
    thread notices it at its next poll: counted once, its work resumed (``on_lost``), then readmitted."""
    import threading

    k = keeper(tmp_path)
    seen = []
    k.on_lost = seen.append
    pusher = threading.Thread(target=k.fleet.mark_lost, args=(1, "weight push failed: refused"))
    pusher.start()
    pusher.join()
    k.poll((3, object()))  # noticed, then readmitted (it answers, and stages version 3)
    k.poll((3, object()))
    assert seen == [1] and k.fleet.snapshot()[1].state == "live"
    assert k.counts == Counter(instances_lost=1, instances_readmitted=1)
    assert k.lost(1, "UNAVAILABLE") and seen == [1, 1]  # the next incarnation's loss: noticed at once
    assert not k.lost(1, "again") and seen == [1, 1] and k.counts["instances_lost"] == 2
