"""Repack policy (Laminar §5, Algorithm 1): ramp-down detection and best-fit consolidation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.rollout.repack_policy import (
    InstanceSnapshot,
    Migrate,
    RepackCoordinator,
    RepackSettings,
    best_fit,
    ramping_down,
)

S = RepackSettings(c_max=0.9, batch_bound=8, interval_s=1.0)


def snap(i: int, kv: float, running: int, version: int = 3, waiting: int = 0, **kw) -> InstanceSnapshot:
    return InstanceSnapshot(i, version, kv, running, waiting, **kw)


def test_ramp_down_needs_falling_kv_below_cmax_nothing_queued_and_a_short_tail():
    assert ramping_down(snap(0, 0.3, 2), 0.5, S)
    assert not ramping_down(snap(0, 0.3, 2), None, S)  # first snapshot: no trend yet
    assert not ramping_down(snap(0, 0.5, 2), 0.5, S)  # flat (the steady phase of Laminar Fig. 9)
    assert not ramping_down(snap(0, 0.6, 2), 0.4, S)  # ramping up
    assert not ramping_down(snap(0, 0.3, 2, waiting=1), 0.5, S)  # work still queued
    assert not ramping_down(snap(0, 0.3, 8), 0.5, S)  # not below the roofline batch
    assert not ramping_down(snap(0, 0.0, 0), 0.5, S)  # idle: nothing to move
    assert not ramping_down(snap(0, 0.3, 2, alive=False), 0.5, S)
    assert not ramping_down(snap(0, 0.3, 2, in_transit=1), 0.5, S)  # its last plan has not landed
    assert not ramping_down(snap(0, 0.95, 2), 0.99, S)  # above c_max


def test_best_fit_releases_the_smallest_onto_the_fullest_that_fits():
    # 0 (kv .1, 1 sample) and 1 (kv .2, 2) go to 3 (kv .5, 3): the fullest after each move;
    # 2 (kv .45, 3) no longer fits anywhere (3 would reach 1.25 > .9; 2 into nothing else)
    plan = best_fit([snap(0, 0.1, 1), snap(1, 0.2, 2), snap(2, 0.45, 3), snap(3, 0.5, 3)], S)
    assert plan == [Migrate(0, 3, 3, 1, 0.1), Migrate(1, 3, 3, 2, 0.2)]


def test_a_destination_is_never_released_in_the_same_plan():
    plan = best_fit([snap(0, 0.1, 1), snap(1, 0.2, 1)], S)
    assert plan == [Migrate(0, 1, 3, 1, 0.1)]


def test_batch_bound_limits_a_destination():
    plan = best_fit([snap(0, 0.1, 5), snap(1, 0.1, 5)], S)  # 10 samples > 8
    assert plan == []


@st.composite
def fleets(draw):
    n = draw(st.integers(1, 12))
    return [snap(i, draw(st.floats(0.0, 1.0)), draw(st.integers(0, 12)), version=draw(st.integers(0, 2)),
                 waiting=draw(st.sampled_from([0, 0, 0, 1])), draining=draw(st.booleans()))
            for i in range(n)], [draw(st.floats(0.0, 1.0)) for _ in range(n)]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(fleets())
def test_every_plan_respects_capacity_version_and_roles(fleet):
    now, prev = fleet
    coord = RepackCoordinator(S, clock=lambda: 0.0)
    coord._kv_prev = dict(enumerate(prev))
    plan = coord.plan(now)
    by = {s.index: s for s in now}
    sources = [m.source for m in plan]
    dests = {m.destination for m in plan}
    assert len(sources) == len(set(sources)) and not set(sources) & dests
    for m in plan:
        src, dst = by[m.source], by[m.destination]
        assert src.version == dst.version == m.version
        assert ramping_down(src, prev[m.source], S) and ramping_down(dst, prev[m.destination], S)
    for d in dests:
        assert not by[d].draining
        moved = [by[m.source] for m in plan if m.destination == d]
        assert by[d].kv_used + sum(s.kv_used for s in moved) <= S.c_max + 1e-12
        assert by[d].running + sum(s.running for s in moved) <= S.batch_bound


def test_coordinator_is_periodic_remembers_kv_and_can_be_forced():
    t = [0.0]
    coord = RepackCoordinator(S, clock=lambda: t[0])
    assert coord.due()
    assert coord.plan([snap(0, 0.5, 2), snap(1, 0.6, 2)]) == []  # first look: no trend
    assert not coord.due()
    assert coord.due(force=True)
    t[0] = 1.0
    assert coord.due()
    assert coord.plan([snap(0, 0.2, 2), snap(1, 0.3, 2)]) == [Migrate(0, 1, 3, 2, 0.2)]
    assert coord.checks == 2


@pytest.mark.parametrize("bad", [dict(c_max=0.0), dict(c_max=1.5), dict(batch_bound=1), dict(interval_s=-1)])
def test_settings_are_validated(bad):
    with pytest.raises(ValueError):
        RepackSettings(**bad)


def test_a_draining_instance_never_receives_but_may_be_released():
    draining = snap(1, 0.2, 2, draining=True)
    # 0 cannot go to the draining 1, but 1's tail goes to 0: 1 then installs its staged version at once
    assert best_fit([snap(0, 0.1, 1), draining], S) == [Migrate(1, 0, 3, 2, 0.2)]
    assert best_fit([draining, snap(2, 0.3, 2)], S) == [Migrate(1, 2, 3, 2, 0.2)]
