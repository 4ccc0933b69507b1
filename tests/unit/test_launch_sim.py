"""The orchestrator's launch path in the simulator (allocator/launch_sim.py): groups start as earlier
ones finish, on the instance with room, in the LPT launch order when estimates and LPT admission
are on; instances on one core share it."""

from __future__ import annotations

import pytest

from allocator.launch_sim import SimGroup, simulate_launched
from services.common.config import load_config
from services.generation.scheduling import InstanceSpec, Job, StepCost, run_instance
from services.rollout.dispatching import GroupDispatcher
from services.rollout.fleet import fleet_of

UNIT = StepCost(k1=0.0, k2=0.0, k3=0.0, k4=1.0, kv_bytes_per_token=1.0)  # one second per step, whatever the batch
SPEC = InstanceSpec(UNIT, kv_capacity_tokens=10**9, max_batch=64)


def group(key: str, length: int, samples: int = 2, estimate: float | None = None) -> SimGroup:
    return SimGroup(key, 4, (length,) * samples, estimate)


def dispatcher(policy: str) -> GroupDispatcher:
    gen = load_config(None, [f"generation.dispatch.policy={policy}"]).generation
    return GroupDispatcher(gen, lambda: None)


def test_one_instance_with_room_for_everything_is_run_instance():
    groups = [group("a", 7), group("b", 3), group("c", 11)]
    jobs = [Job(f"{g.key}/{j}", 4, n) for g in groups for j, n in enumerate(g.lengths)]
    res = simulate_launched(groups, SPEC, 1, capacity=64, admission="fcfs")
    assert res.makespan_s == pytest.approx(run_instance(jobs, SPEC, "fcfs").makespan_s)
    assert res.finish_s == {"a": pytest.approx(7), "b": pytest.approx(3), "c": pytest.approx(11)}


def test_a_group_starts_where_a_finished_one_freed_room():
    """Room for one group per instance: after a, b and c start on the instance b left (list
    scheduling), where a dispatch of the whole batch at t = 0 would alternate."""
    groups = [group("a", 100), group("b", 10), group("c", 10), group("d", 10)]
    res = simulate_launched(groups, SPEC, 2, capacity=2, admission="fcfs")
    assert res.instance_of == {"a": 0, "b": 1, "c": 1, "d": 1}
    assert res.finish_s["d"] == pytest.approx(30)
    assert res.makespan_s == pytest.approx(100)


def test_lpt_launch_order_needs_a_dispatcher_and_lpt_admission():
    groups = [group("short", 5, estimate=5.0), group("long", 50, estimate=50.0), group("mid", 20, estimate=20.0)]
    lpt = simulate_launched(groups, SPEC, 2, capacity=2, admission="lpt", dispatcher=dispatcher("round_robin"))
    assert lpt.launch_order == ["long", "mid", "short"]
    assert lpt.makespan_s == pytest.approx(50)
    plain = simulate_launched(groups, SPEC, 2, capacity=2, admission="lpt")  # no dispatcher: the task's order
    assert plain.launch_order == ["short", "long", "mid"]
    fcfs = simulate_launched(groups, SPEC, 2, capacity=2, admission="fcfs", dispatcher=dispatcher("round_robin"))
    assert fcfs.launch_order == ["short", "long", "mid"]
    assert plain.makespan_s == pytest.approx(50)  # short (5) then mid (20) on one instance: 25 < 50


def test_instances_sharing_one_core_take_turns():
    groups = [group("a", 10), group("b", 10)]
    own = simulate_launched(groups, SPEC, 2, capacity=2, admission="fcfs")
    shared = simulate_launched(groups, SPEC, 2, capacity=2, admission="fcfs", cores=1)
    assert own.makespan_s == pytest.approx(10)
    assert shared.makespan_s == pytest.approx(20)
    assert shared.work_s == [pytest.approx(10), pytest.approx(10)]


def test_the_dispatchers_books_are_those_of_a_run():
    """The live dispatcher learns the finished lengths, so it can carry over to the next step as in a
    run; each group's samples and estimated work are booked on the instances' table and released as
    they finish; a least_tokens probe is restored afterwards."""
    d = dispatcher("least_tokens")
    probe = d.probe
    seen = []
    place = d.place
    d.place = lambda groups, candidates: seen.append([v.work for v in candidates]) or place(groups, candidates)
    fleet = fleet_of(["a", "b"], 4)
    res = simulate_launched([group("a", 6, samples=4, estimate=5.0), group("b", 9, samples=4, estimate=7.0),
                             group("c", 3, samples=4, estimate=2.0)], SPEC, 2, capacity=4, admission="fcfs",
                            dispatcher=d, fleet=fleet)
    assert res.instance_of == {"a": 0, "b": 1, "c": 0}
    # c starts when a finished, where a ran without asking the policy: b's instance (its 4 samples and their
    # 7.0 x 4 of estimated work booked) has no room, so a has the only one (GroupDispatcher.plan_round)
    assert seen == [[0.0, 0.0]] and fleet.snapshot()[1].placed == 1
    assert [(r.inflight, r.work, r.placed) for r in fleet.snapshot().rows] == [(0, 0.0, 2), (0, 0.0, 1)]
    dist = d.lengths.distribution(1)
    assert len(dist) == 12 and dist.quantile(0.0) == 3.0 and dist.quantile(1.0) == 9.0
    assert d.probe is probe


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="capacity"):
        simulate_launched([group("a", 5, samples=3)], SPEC, 2, capacity=2, admission="fcfs")
    with pytest.raises(ValueError, match="at least one group"):
        simulate_launched([], SPEC, 2, capacity=2, admission="fcfs")
    with pytest.raises(ValueError, match="unique"):
        simulate_launched([group("a", 5), group("a", 6)], SPEC, 2, capacity=2, admission="fcfs")
    with pytest.raises(ValueError, match="rows"):
        simulate_launched([group("a", 5)], SPEC, 2, capacity=2, admission="fcfs", fleet=fleet_of(["x"], 2))
