"""The fleet table (services.rollout.fleet): one owner of every SGS instance's state.

The races of issue 53's bug class run on real threads, ordered by events and barriers; the only
timeouts are bounds on waits that must not hang (or, once, a wait that must expire because the
other thread is held out by the table's lock).
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from services.rollout.fleet import Fleet, FleetError, Reservation, evaluation_pick
from services.rollout.routing import instances_to_sync, pick_instance

ANY = lambda v: True  # noqa: E731 - no staleness budget in play
WAIT_S = 10.0  # bound on waits that must not hang


def fleet_of(n: int, capacity: int = 4, version: int = 0) -> Fleet:
    fleet = Fleet(capacity)
    for k in range(n):
        fleet.join(f"h:{9000 + k}", live=True, version=version)
    return fleet


def run_threads(*targets) -> None:
    errors: list[BaseException] = []

    def guard(fn):
        def run():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread
                errors.append(exc)
        return run

    threads = [threading.Thread(target=guard(t), daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
        assert not t.is_alive(), "a thread hung"
    if errors:
        raise errors[0]


# ---------------------------------------------------------------------- rows and states
def test_rows_keep_their_index_through_every_state():
    fleet = Fleet(capacity=2)
    a = fleet.join("h:1", live=True, version=3, pool="fast")
    b = fleet.join("h:2")  # joining: not routable until it has the newest weights
    assert (a, b) == (0, 1)
    assert fleet.live() == [0]
    assert [v.alive for v in fleet.views()] == [True, False]
    fleet.mark_live(b, version=3)
    assert fleet.live() == [0, 1]
    assert fleet.drain(a) == 0
    assert fleet.live() == [1]
    fleet.remove(a)
    with pytest.raises(FleetError, match="already has row 1"):
        fleet.join("h:2")
    assert fleet.join("h:1") == 2  # the address is free again after removal; a new row
    snap = fleet.snapshot()
    assert [r.state for r in snap.rows] == ["removed", "live", "joining"]
    assert snap.by_address("h:1").index == 2
    with pytest.raises(FleetError, match="is removed"):
        fleet.mark_live(a, 3)
    with pytest.raises(FleetError, match="no instance 7"):
        fleet.mark_lost(7)


def test_a_draining_instance_takes_no_new_work_and_is_removed_once_empty():
    fleet = fleet_of(2, capacity=4)
    res = fleet.acquire(None, ANY, 3)
    assert res.index == 0
    assert fleet.drain(0) == 3
    assert fleet.acquire(None, ANY, 1).index == 1
    with pytest.raises(FleetError, match="still holds 3"):
        fleet.remove(0)
    fleet.release(res)
    assert fleet.wait_drained(0, timeout_s=WAIT_S)
    fleet.remove(0)
    assert fleet.snapshot()[0].state == "removed"


def test_views_feed_the_routing_policies_unchanged():
    fleet = fleet_of(3, capacity=4)
    fleet.record_version(0, 2)
    fleet.set_incoming(Counter({2: 3}))  # a repack moves 3 samples to instance 2
    views = fleet.views()
    assert [(v.index, v.version, v.inflight, v.capacity, v.alive) for v in views] == [
        (0, 2, 0, 4, True), (1, 0, 0, 4, True), (2, 0, 3, 4, True)]
    assert pick_instance(None, views, ANY, need=2).index == 1  # 2 is nearly full, 0 is newer
    assert instances_to_sync(views, 2, ANY) == [1]  # idle and older; 2 holds incoming work


def test_acquire_applies_pools_eligibility_and_stickiness():
    fleet = Fleet(capacity=4)
    for k, pool in enumerate(["fast", "fast", "slow"]):
        fleet.join(f"h:{k}", live=True, version=0, pool=pool)
    assert fleet.acquire(None, ANY, pools={"slow"}).index == 2
    assert fleet.acquire(None, ANY, pools={"fast"}, eligible=[1]).index == 1
    fleet.acquire(None, ANY, 2, eligible=[0])  # 0 holds 2, 1 holds 1
    assert fleet.acquire(None, ANY, pools={"fast"}, prefer=0, slack=1).index == 0
    assert fleet.snapshot()[0].placed == 2


def test_versions_only_grow_and_a_stale_reservation_is_not_released_twice():
    fleet = fleet_of(1)
    fleet.record_version(0, 5)
    fleet.record_version(0, 3)  # a late offer of an older version
    assert fleet.snapshot()[0].version == 5
    old = fleet.acquire(None, ANY, 2)
    fleet.mark_lost(0, "UNAVAILABLE")
    fleet.mark_live(0, version=6)
    new = fleet.acquire(None, ANY, 1)
    assert not fleet.release(old)  # its call returned after the loss: that load is gone already
    assert fleet.snapshot()[0].inflight == 1
    assert fleet.release(new)
    assert fleet.snapshot()[0].inflight == 0
    with pytest.raises(FleetError, match="reservation of 1"):
        fleet.release(Reservation(0, 1, 6, new.epoch), samples=2)


def test_a_reworked_reservation_books_its_outstanding_samples_at_the_new_estimate():
    """A group's finished siblings moved its estimate: the samples still out count at the new one,
    and releasing them hands back exactly what is booked."""
    fleet = fleet_of(1)
    res = fleet.reserve(0, 4, work=100.0)
    fleet.release(res, 1)
    assert fleet.snapshot()[0].work == 300.0
    res = fleet.rework(res, 3, 250.0)
    assert fleet.snapshot()[0].work == 750.0 and res.work == 250.0
    fleet.release(res, 3)
    assert fleet.snapshot()[0].work == 0.0 and fleet.snapshot()[0].inflight == 0
    with pytest.raises(FleetError, match="rework"):
        fleet.rework(res, 5, 1.0)
    stale = fleet.reserve(0, 2, work=10.0)
    fleet.mark_lost(0, "UNAVAILABLE")
    assert fleet.rework(stale, 2, 99.0) is stale  # lost since: nothing booked to move


# ---------------------------------------------------------------------- the bug class
def test_a_join_racing_a_pick(fine_switching):
    """ac10530: a picker on another thread saw a row list and a version list of different lengths
    while an instance joined. On the table a join adds the whole row under the lock: every
    snapshot a picker takes is one consistent table, and a joining row is never picked. Each row
    has room for one sample and the picker keeps what it books, so its picks follow the joins."""
    fleet = fleet_of(1, capacity=1)
    joins = 1000
    picking, joined = threading.Event(), threading.Event()
    seen: list[int] = []

    def joiner():
        assert picking.wait(WAIT_S)
        for k in range(joins):
            i = fleet.join(f"j:{k}")  # joining: it waits for weights before it is routable
            if k % 2:
                fleet.mark_live(i, version=0)
        joined.set()

    def pick_once() -> None:
        snap = fleet.snapshot()
        assert [r.index for r in snap.rows] == list(range(len(snap)))
        assert len(snap.views()) == len(snap)
        res = fleet.acquire(None, ANY)
        if res is not None:
            seen.append(res.index)

    def picker():
        picking.set()
        while not joined.is_set():
            pick_once()
        pick_once()  # whatever joined last

    run_threads(joiner, picker)
    final = fleet.snapshot()
    assert len(final) == joins + 1
    assert sorted(seen) == sorted(set(seen))  # one sample per row: never over-booked
    # no row leaves "live" here, so a row that is not live now (the even k: still joining) was never picked
    assert all(final[i].state == "live" for i in seen)
    assert sum(r.inflight for r in final.rows) == len(seen)
    assert all(r.inflight <= r.capacity for r in final.rows)


def test_a_join_waits_for_a_pick_in_progress():
    """The ac10530 window itself: an instance joins while a pick is under way. The join is held out
    until the pick has booked, so the pick's views and the rows it books on are one table."""
    fleet = fleet_of(1, capacity=4)
    inside, joined = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def check(version: int) -> bool:
        inside.set()
        seen["joined_during_pick"] = joined.wait(0.3)  # must expire: the join waits for the lock
        return True

    def picker():
        seen["pick"] = fleet.acquire(None, check, 4)

    def joiner():
        assert inside.wait(WAIT_S)
        seen["row"] = fleet.join("h:late", live=True, version=0)
        joined.set()

    run_threads(picker, joiner)
    assert seen["joined_during_pick"] is False
    assert (seen["pick"].index, seen["row"]) == (0, 1)
    assert fleet.acquire(None, ANY, 4).index == 1


def test_a_loss_racing_a_sync():
    """762fbe1 / 642b718: the learner's thread offered (and waited for) a version on an instance
    the rollout thread had not yet seen fail. On the table the sync decides on a snapshot, the loss
    lands in between, and recording the version answers False: the instance stays lost, is not
    routable, and comes back only through mark_live at the version it actually staged."""
    fleet = fleet_of(2, capacity=4)
    decided, lost = threading.Event(), threading.Event()
    recorded: dict[int, bool] = {}

    def sync():  # the rollout (or learner) thread: lazy sync on a snapshot, then the offer
        targets = instances_to_sync(fleet.views(), 1, ANY)
        decided.set()
        assert lost.wait(WAIT_S)
        for i in targets:
            recorded[i] = fleet.record_version(i, 1)

    def lose():  # the generator's thread: the instance's call failed UNAVAILABLE
        assert decided.wait(WAIT_S)
        assert fleet.mark_lost(0, "UNAVAILABLE")
        lost.set()

    run_threads(sync, lose)
    snap = fleet.snapshot()
    assert recorded == {0: False, 1: True}
    assert (snap[0].state, snap[0].version) == ("lost", 0)
    assert (snap[1].state, snap[1].version) == ("live", 1)
    assert fleet.acquire(None, ANY, 4).index == 1
    assert fleet.acquire(None, ANY, 1) is None  # the lost one takes nothing
    assert fleet.losses == 1 and not fleet.mark_lost(0)  # a second report of the same loss
    fleet.mark_live(0, version=1)
    assert fleet.snapshot()[0].version == 1 and fleet.acquire(1, ANY).index == 0


def test_an_evaluation_pick_on_a_full_instance():
    """Evaluation built its own router with every version 0 and unlimited capacity: it piled its
    shares on instances training had filled, on any version. On the run's table it sees both."""
    fleet = fleet_of(3, capacity=8)
    fleet.record_version(0, 4)
    fleet.record_version(1, 4)
    training = fleet.acquire(None, ANY, 8, eligible=[0])  # instance 0 is full of training work
    assert evaluation_pick(fleet, version=4, need=4).index == 1  # not 0 (full), not 2 (version 0)
    assert evaluation_pick(fleet, version=4, need=4).index == 1
    assert evaluation_pick(fleet, version=4, need=1) is None  # every instance at 4 is full: wait
    fleet.release(training, 3)
    assert evaluation_pick(fleet, version=4, need=3).index == 0
    assert evaluation_pick(fleet, version=0, need=8).index == 2  # an older evaluation may use 2
    assert all(r.load <= r.capacity for r in fleet.snapshot().rows)


def test_a_plan_on_a_snapshot_does_not_over_book_an_instance_that_filled_or_left():
    fleet = fleet_of(2, capacity=4)
    plan = pick_instance(None, fleet.views(), ANY, need=3)  # a dispatch policy plans on a snapshot
    assert plan.index == 0
    fleet.acquire(None, ANY, 2, eligible=[0])  # another workflow's pick lands first
    assert fleet.reserve(plan.index, 3) is None
    fleet.mark_lost(1)
    assert fleet.reserve(1, 1) is None
    assert fleet.reserve(0, 3, over=True).samples == 3  # a placement the caller must make (migration)
    assert fleet.reserve(0, 1, min_version=1) is None


def test_concurrent_acquire_and_release_never_over_book(fine_switching):
    fleet = fleet_of(3, capacity=5)
    workers, rounds = 6, 300
    start = threading.Barrier(workers + 1)
    done = threading.Event()
    worst: list[int] = []

    def worker(k: int):
        def run():
            start.wait(WAIT_S)
            for r in range(rounds):
                res = fleet.acquire(None, ANY, 1 + (k + r) % 3, prefer=k % 3, slack=2)
                if res is not None:
                    fleet.release(res, 1)
                    fleet.release(Reservation(res.index, res.samples - 1, res.version, res.epoch))
        return run

    def watcher():
        start.wait(WAIT_S)
        while not done.is_set():
            worst.append(max(r.load - r.capacity for r in fleet.snapshot().rows))

    watch = threading.Thread(target=watcher, daemon=True)
    watch.start()
    run_threads(*[worker(k) for k in range(workers)])
    done.set()
    watch.join(WAIT_S)
    assert worst and max(worst) <= 0
    assert [r.inflight for r in fleet.snapshot().rows] == [0, 0, 0]


def test_a_pick_holds_out_every_other_pick_until_it_has_booked():
    """The atomic pick: while one picker is inside ``acquire`` (its staleness check runs), another
    picker's ``acquire`` cannot complete, so both cannot take the last room on an instance."""
    fleet = fleet_of(1, capacity=4)
    inside, second_done = threading.Event(), threading.Event()
    results: dict[str, Reservation | None] = {}

    def slow_check(version: int) -> bool:
        inside.set()
        results["second_done_early"] = second_done.wait(0.3)  # must expire: the second is held out
        return True

    def first():
        results["first"] = fleet.acquire(None, slow_check, 4)

    def second():
        assert inside.wait(WAIT_S)
        results["second"] = fleet.acquire(None, ANY, 4)
        second_done.set()

    run_threads(first, second)
    assert results["second_done_early"] is False
    assert results["first"] is not None and results["second"] is None
    assert fleet.snapshot()[0].inflight == 4


def test_snapshots_never_change_under_a_reader():
    fleet = fleet_of(2, capacity=4)
    taken, changed = threading.Event(), threading.Event()
    held: dict[str, object] = {}

    def reader():
        snap = fleet.snapshot()
        held["snap"], held["copy"] = snap, [tuple(vars(r).items()) for r in snap.rows]
        taken.set()
        assert changed.wait(WAIT_S)
        assert [tuple(vars(r).items()) for r in snap.rows] == held["copy"]
        assert len(snap) == 2 and snap.revision < fleet.snapshot().revision

    def writer():
        assert taken.wait(WAIT_S)
        fleet.acquire(None, ANY, 3)
        fleet.record_version(1, 7)
        fleet.mark_lost(0)
        fleet.join("h:new")
        changed.set()

    run_threads(reader, writer)
    with pytest.raises(AttributeError):
        held["snap"].rows[0].inflight = 9  # frozen rows
