"""Routing and synchronisation policy (StaleFlow Algorithm 2, lazy sync) on hand-made snapshots."""

from __future__ import annotations

from services.rollout.routing import InstanceView, check_routable, instances_to_sync, pick_instance, pull_on_completion
from services.rollout.staleness import StalenessManager


def views(*specs):
    return [InstanceView(i, v, load, cap) for i, (v, load, cap) in enumerate(specs)]


def test_new_trajectory_goes_to_the_oldest_routable_version_then_least_loaded():
    m = StalenessManager(eta=1, batch_size=2)
    m.reserve("a", 0)
    m.reserve("b", 0)
    m.occupy("a")
    m.occupy("b")
    m.consume()  # head 1: version 0 may still use buffer 1
    inst = views((0, 5, 8), (1, 0, 8), (1, 1, 8))
    assert pick_instance(None, inst, m.can_reserve).index == 0
    m.reserve("c", 0)
    m.reserve("d", 0)  # buffer 1 is now full: version 0 can no longer start work
    assert not check_routable(None, inst[0], m.can_reserve)
    assert pick_instance(None, inst, m.can_reserve).index == 1  # least loaded among version 1


def test_resumed_trajectory_needs_an_instance_at_least_as_new_and_capacity():
    m = StalenessManager(eta=0, batch_size=1)
    inst = views((0, 0, 4), (2, 3, 4), (3, 4, 4))
    assert pick_instance(1, inst, m.can_reserve).index == 1  # 0 is too old, 2 is full
    assert pick_instance(1, inst, m.can_reserve, need=2) is None


def test_lazy_sync_only_when_blocked_or_idle():
    m = StalenessManager(eta=1, batch_size=1)
    m.reserve("a", 0)  # buffer 1
    m.occupy("a")  # buffer 0
    m.consume()  # head 1; buffer 1 empty: version 0 can still reserve there
    inst = views((0, 3, 8), (0, 0, 8), (1, 2, 8))
    assert instances_to_sync(inst, 1, m.can_reserve) == [1]  # busy instance 0 keeps its version
    m.reserve("b", 0)  # buffer 1 full for version 0
    assert instances_to_sync(inst, 1, m.can_reserve) == [0, 1]
    # pulled on completion (every run without partial rollout): blocked 0 drains at its version first
    assert instances_to_sync(inst, 1, m.can_reserve, idle_only=pull_on_completion(False)) == [1]
    assert instances_to_sync(inst, 1, m.can_reserve, idle_only=pull_on_completion(True)) == [0, 1]  # interrupts


def test_a_preferred_instance_is_kept_within_the_slack():
    views = [InstanceView(0, 3, 4, 10), InstanceView(1, 3, 1, 10)]
    assert pick_instance(None, views, lambda v: True, prefer=0, slack=3).index == 0
    assert pick_instance(None, views, lambda v: True, prefer=0, slack=2).index == 1
    assert pick_instance(None, views, lambda v: True, prefer=7, slack=99).index == 1  # not a candidate
