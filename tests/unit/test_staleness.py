"""Hand-made cases of the staleness manager (StaleFlow §4), with known answers."""

from __future__ import annotations

import pytest

from services.rollout.staleness import StalenessError, StalenessManager


def test_reserve_is_worst_case_and_occupy_moves_reservations_back():
    # eta = 1, three entries per buffer, everything starts on version 0 (Figure 7's setting)
    m = StalenessManager(eta=1, batch_size=3)
    assert [m.reserve(k, 0) for k in ("t1", "t2", "t3")] == [1, 1, 1]  # latest legal buffer first
    assert [m.reserve(k, 0) for k in ("t4", "t5", "t6")] == [0, 0, 0]
    assert not m.can_reserve(0)  # both legal buffers full: needs newer weights
    assert m.state(0) == "stuck" and m.state(1) == "stuck"
    # t1 finishes: the earliest reservation that may sit in buffer 1 (t4) moves there, t1 takes t4's slot
    assert m.occupy("t1") == 0
    assert m.location("t4") == 1
    assert [e.key if e else None for e in m.buffer(0)] == ["t1", "t5", "t6"]
    for k in ("t2", "t3"):
        assert m.occupy(k) == 0
    assert m.ready() and m.state(1) == "stuck"
    result = m.consume()
    assert [e.key for e in result.entries] == ["t1", "t2", "t3"]
    assert all(e.staleness == 0 and e.buffer_version == 0 for e in result.entries)
    assert m.head == 1 and m.can_reserve(1) and not m.can_reserve(0)


def test_reservation_of_an_older_version_cannot_move_past_its_bound():
    m = StalenessManager(eta=1, batch_size=1)
    m.reserve("a", 0)  # buffer 1
    m.reserve("b", 0)  # buffer 0
    m.occupy("b")  # no earlier reservation to move: b stays in buffer 0
    assert m.location("b") == 0 and m.location("a") == 1
    m.consume()
    m.reserve("c", 1)  # buffer 2
    assert m.occupy("c") == 2  # buffer 1 is held by a (V=0, may not go to 2)
    assert m.state(1) == "stuck"
    with pytest.raises(StalenessError, match="stuck, not ready"):
        m.consume()
    m.occupy("a")
    assert m.consume().entries[0].key == "a"
    assert m.consume().entries[0].key == "c"


def test_abort_pulls_finished_entries_forward():
    m = StalenessManager(eta=2, batch_size=1)
    m.reserve("slow", 0)  # buffer 2
    m.reserve("fast", 0)  # buffer 1
    m.reserve("x", 0)  # buffer 0
    m.occupy("fast")  # x moves to buffer 1, fast takes buffer 0
    assert m.location("fast") == 0
    m.occupy("slow")  # buffer 2 freed; x (V=0) moves there; slow takes buffer 1
    assert (m.location("slow"), m.location("x")) == (1, 2)
    aborted = m.abort("fast", "filtered")
    assert aborted.state == "occupied" and aborted.reason == "filtered"
    assert m.location("slow") == 0 and m.ready()  # the finished entry moved forward


def test_abort_moves_a_finished_entry_past_reservations_that_may_take_its_place():
    # found by the property test: after an abort, an occupied entry pulled forward must not stop
    # behind a reservation that could legally sit where it landed (the head would wait for nothing)
    m = StalenessManager(eta=3, batch_size=1)
    for k in ("t0", "t1", "t2", "t3"):
        m.reserve(k, 0)  # buffers 3, 2, 1, 0
    m.occupy("t0")
    m.consume()  # head 1: t2 (buffer 1), t1 (2), t3 (3), all reserved on version 0
    assert m.reserve("t4", 1) == 4
    m.occupy("t4")  # buffers 1-3 hold reservations of version 0 that cannot move to 4: t4 stays
    assert m.location("t4") == 4 and not m.ready()
    m.abort("t1", "given up")  # t4 fills buffer 2, then t2 (V=0, may sit in 2) lets it pass to the head
    assert m.location("t4") == 1 and m.location("t2") == 2 and m.ready()


def test_batch_level_redundancy_aborts_the_surplus():
    m = StalenessManager(eta=0, batch_size=2, redundancy=1)
    for k in ("a", "b", "c"):
        m.reserve(k, 0)
    m.occupy("c")
    m.occupy("a")
    assert m.ready()
    result = m.consume()
    assert sorted(e.key for e in result.entries) == ["a", "c"]
    assert [(a.key, a.reason, a.state) for a in result.aborted] == [("b", "redundant", "reserved")]
    assert m.tracked() == {}


def test_group_entries_and_async_bound():
    # 8 trajectories per batch in groups of 4 -> 2 group entries per buffer
    m = StalenessManager(eta=2, batch_size=8, group_size=4, async_bound=1)
    assert m.batch == 2
    m.reserve("g_old", 0)
    m.reserve("g1", 0)
    m.reserve("g2", 0)
    m.occupy("g1")
    m.occupy("g2")
    result = m.consume()  # head 0 -> 1; g_old (V=0) is still fine: 0 >= 1 - 1
    assert result.aborted == []
    m.reserve("g3", 1)
    m.reserve("g4", 1)
    m.occupy("g3")
    m.occupy("g4")
    result = m.consume()  # head 2: g_old (V=0) < 2 - 1 -> aborted by RollArt's rule
    assert [(a.key, a.reason) for a in result.aborted] == [("g_old", "async_bound")]


def test_staleness_metrics_of_consumed_entries():
    m = StalenessManager(eta=2, batch_size=1)
    m.reserve("a", 0)
    m.reserve("b", 0)
    m.occupy("b", generated_version=0)
    m.consume()  # head 1
    m.occupy("a", generated_version=0)  # finished while the trainer was at version 1
    e = m.consume().entries[0]
    assert (e.buffer_version, e.staleness, e.inherent_staleness) == (1, 1, 1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"eta": -1, "batch_size": 4}, "eta must be >= 0"),
        ({"eta": 1, "batch_size": 6, "group_size": 4}, "group size 4 does not divide the batch size 6"),
        ({"eta": 1, "batch_size": 0}, "must be >= 1"),
        ({"eta": 1, "batch_size": 4, "async_bound": -2}, "async_bound must be >= 0"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(StalenessError, match=message):
        StalenessManager(**kwargs)


def test_bad_calls_are_named():
    m = StalenessManager(eta=1, batch_size=2)
    with pytest.raises(StalenessError, match="newer than the trainer's version"):
        m.reserve("a", 3)
    m.reserve("a", 0)
    with pytest.raises(StalenessError, match="already tracked"):
        m.reserve("a", 0)
    with pytest.raises(StalenessError, match="unknown trajectory"):
        m.occupy("zz")
    with pytest.raises(StalenessError, match="older than its V_traj"):
        m.occupy("a", generated_version=-1)
    m.occupy("a")
    with pytest.raises(StalenessError, match="already occupied"):
        m.occupy("a")
    with pytest.raises(StalenessError, match="waiting, not ready"):
        m.consume()


def test_no_slot_exists_past_the_runs_last_buffer():
    m = StalenessManager(2, 2, 1, end_version=2)  # the run trains buffers 0 and 1 (2 entries each)
    assert [m.reserve(k, 0) for k in "abcd"] == [1, 1, 0, 0]  # capped at buffer 1, not 0 + eta = 2
    assert not m.can_reserve(0)  # both buffers are full; buffer 2 does not exist
    assert StalenessManager(2, 2, 1).can_reserve(0) and StalenessManager(2, 2, 1, end_version=0).can_reserve(0) is False
    m.occupy("d")
    assert m.location("d") == 0
