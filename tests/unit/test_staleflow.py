"""StaleFlow's coordination strategies (``services.rollout.staleflow``, §5.3 and Appendix D): the
throughput model (eq. 2-4), routing by marginal gain with the mu threshold and withholding (Alg. 3),
synchronisation after a tentative update (Alg. 4), and migration (Alg. 5)."""

from __future__ import annotations

import copy

import pytest

from services.generation.scheduling.cost import InstanceSpec, StepCost
from services.rollout.staleflow import (
    CoordinationSettings,
    Load,
    ThroughputModel,
    Traj,
    migrations,
    routable,
    route,
    to_sync,
)
from services.rollout.staleness import StalenessManager

# H20 serving a 7B model (allocator/profiles/H20-qwen2.5-7b.json): memory-bound below ~30 sequences
COST = StepCost(k1=3.125e-13, k2=0.00476, k3=0.000159, k4=0.002, kv_bytes_per_token=57344.0)
MODEL = ThroughputModel(InstanceSpec(COST, kv_capacity_tokens=1_000_000, max_batch=256))


def load(i: int, version: int = 0, running: int = 0, waiting: int = 0, kv: float = 0.0, cap: int = 512) -> Load:
    return Load(i, version, running, waiting, kv, cap)


def group(key: str, tokens: int = 100, samples: int = 8) -> Traj:
    return Traj(key, None, tokens, samples)


class Everything:
    """A budget that reserves at any version (routing without a staleness limit)."""

    def __init__(self) -> None:
        self.reserved: list[tuple[str, int]] = []

    def can_reserve(self, version: int) -> bool:
        return True

    def reserve(self, key: str, version: int) -> int:
        self.reserved.append((key, version))
        return version


def test_the_throughput_model_is_eq_2_and_gains_shrink_once_compute_bound():
    assert MODEL.throughput(0, 0.0) == 0.0
    assert MODEL.throughput(10, 1000.0) == pytest.approx(10 / COST.step(10, 1000.0))
    t = group("a")
    assert MODEL.gain(load(0), t) == pytest.approx(MODEL.ideal(t))  # an idle instance gains the ideal
    # memory-bound: another group almost adds its own throughput; compute-bound: far less
    assert MODEL.gain(load(0, running=8, kv=800), t) > 0.8 * MODEL.ideal(t)
    assert MODEL.gain(load(0, running=64, kv=6400), t) < 0.3 * MODEL.ideal(t)


def test_a_group_that_would_only_queue_gains_nothing():
    full_kv = Load(0, 0, 4, 0, 999_900.0, 512)
    queued = load(0, running=4, waiting=1, kv=400)
    assert MODEL.gain(full_kv, group("a")) == 0.0 and MODEL.after(full_kv, group("a")).waiting == 8
    assert MODEL.gain(queued, group("a")) == 0.0


def test_routing_withholds_once_no_instance_gains_mu_of_the_ideal():
    """Alg. 3: two idle instances take groups while the marginal gain stays above mu x ideal; the
    rest are withheld (not spread to capacity as a least-loaded pick would)."""
    budget = Everything()
    trajs = [group(f"g{k}") for k in range(40)]
    routes, after = route(trajs, [load(0), load(1)], MODEL, budget, mu=0.3)
    assert 4 <= len(routes) < 40  # some routed, the rest withheld
    assert [r.key for r in routes] == [f"g{k}" for k in range(len(routes))]  # in queue order, then stop
    assert {r.instance for r in routes} == {0, 1} and abs(after[0].running - after[1].running) <= 8
    assert budget.reserved == [(r.key, 0) for r in routes]  # new groups reserved as they route
    # a lower threshold routes more; mu close to 1 only what batches for free (memory-bound: the
    # weights are read once a step whatever the batch, k2 >= k3 x n up to ~30 sequences)
    assert len(route(trajs, [load(0), load(1)], MODEL, Everything(), mu=0.05)[0]) > len(routes)
    free, after = route(trajs, [load(0), load(1)], MODEL, Everything(), mu=0.99)
    assert len(free) < len(routes) and all(ld.running * COST.k3 <= COST.k2 for ld in after)


def test_older_trajectories_route_first_and_the_oldest_version_group_is_preferred():
    """The multi-level queue: a resumed trajectory with the oldest V_traj before newer and new
    ones; among instances whose gain passes the threshold, the oldest version first."""
    trajs = [group("new"), Traj("r5", 5, 300), Traj("r3", 3, 300)]
    loads = [load(0, version=6), load(1, version=4), load(2, version=5)]
    routes, _ = route(trajs, loads, MODEL, Everything(), mu=0.3)
    assert [r.key for r in routes] == ["r3", "r5", "new"]
    assert routes[0].instance == 1  # version 4 >= 3, the oldest group
    assert routes[1].instance == 2 and routes[1].v_traj == 5  # version 5 >= 5 (4 is too old)
    assert routes[2].instance == 1 and routes[2].v_traj == 4  # a new group takes its instance's version


def test_a_blocked_head_stops_routing_and_exact_trajectories_need_their_own_version():
    """Alg. 3 stops at the first trajectory it cannot route; without partial rollout a resume goes
    only to an instance at exactly its version, and waiting for one holds back nothing else."""
    exact = Traj("r2", 2, 300, exact=True)
    assert routable(exact, load(0, version=2), lambda v: True)
    assert not routable(exact, load(0, version=3), lambda v: True)
    assert routable(Traj("r2", 2, 300), load(0, version=3), lambda v: True)
    resumed = Traj("r1", 1, 300)
    routes, _ = route([resumed, group("new")], [load(0, version=0)], MODEL, Everything(), mu=0.3)
    assert routes == []  # the head waits for an instance of version >= 1, and nothing behind it goes first
    routes, _ = route([exact, group("new")], [load(0, version=3)], MODEL, Everything(), mu=0.3)
    assert [r.key for r in routes] == ["new"]  # an exact resume waits for its version without blocking others
    # on its version's busy instance, below mu x ideal, it still goes (it was running already)
    routes, _ = route([exact], [load(0, version=2, running=64, kv=64_000)], MODEL, Everything(), mu=0.3)
    assert [r.key for r in routes] == ["r2"]
    routes, _ = route([Traj("r2", 2, 300)], [load(0, version=2, running=64, kv=64_000)], MODEL, Everything(), mu=0.3)
    assert routes == []  # with partial rollout it is withheld like any other
    assert not routable(group("g", samples=8), load(0, running=500, cap=504), lambda v: True)  # no room


def test_sync_only_after_a_tentative_update_routes_work_there():
    """Alg. 4: an instance behind the newest version is synced when nothing waiting can go to it at
    its version and routing would send it work at the newest; never merely because it is behind."""
    mgr = StalenessManager(eta=0, batch_size=16, group_size=8, start_version=1)  # only version 1 reserves
    loads = [load(0, version=0, running=16, kv=1600), load(1, version=1, running=40, kv=4000)]
    trajs = [group("a"), group("b")]
    assert not mgr.can_reserve(0) and mgr.can_reserve(1)
    synced = to_sync(loads, trajs, 1, MODEL, lambda: copy.deepcopy(mgr), mgr.can_reserve, mu=0.3)
    assert synced == [0]
    assert mgr.tracked_count() == 0  # the tentative routing reserved nothing real
    # nothing waiting: no reason to sync
    assert to_sync(loads, [], 1, MODEL, lambda: copy.deepcopy(mgr), mgr.can_reserve, mu=0.3) == []
    # work it can still take at its version: it keeps its version
    old = [Traj("r0", 0, 300)]
    assert to_sync(loads, old, 1, MODEL, lambda: copy.deepcopy(mgr), mgr.can_reserve, mu=0.3) == []


def test_sync_takes_candidates_one_after_another_and_spares_busy_instances():
    """Only as many instances sync as the waiting work needs, idle ones first: with room for two
    new groups at the newest version, one idle instance takes both; the other idle one and the busy
    ones (whose trajectories a sync would interrupt) stay where they are."""
    mgr = StalenessManager(eta=0, batch_size=16, group_size=8, start_version=1)  # 2 groups, version 1 only
    loads = [load(0, running=24, kv=2400), load(1), load(2, running=40, kv=4000), load(3)]
    trajs = [group(f"g{k}") for k in range(4)]
    assert to_sync(loads, trajs, 1, MODEL, lambda: copy.deepcopy(mgr), mgr.can_reserve, mu=0.3) == [1]
    # nothing idle: the least loaded busy instance syncs, one is enough
    busy = [load(0, running=24, kv=2400), load(1, running=16, kv=1600)]
    assert to_sync(busy, trajs, 1, MODEL, lambda: copy.deepcopy(mgr), mgr.can_reserve, mu=0.3) == [1]


def test_migration_moves_a_long_queue_and_the_fastest_instance_when_the_gap_is_wide():
    s = CoordinationSettings(phi_wait=3, phi_throughput=5.0)
    balanced = [load(0, running=20, kv=2000), load(1, running=16, kv=1600)]
    assert migrations(balanced, MODEL, s) == {}
    queued = [load(0, running=20, waiting=7, kv=2000), load(1, running=16, kv=1600)]
    assert migrations(queued, MODEL, s) == {0: 4}
    skewed = [load(0, running=60, kv=6000), load(1, running=1, kv=900)]
    assert migrations(skewed, MODEL, s) == {0: 60}
    assert migrations([load(0), load(1)], MODEL, s) == {}  # idle instances hold nothing to move


def test_sync_stops_trying_candidates_once_one_no_larger_did_not_help():
    """A tentatively updated candidate is an empty instance at the newest version whatever it held:
    once one did not place more work, trying the others of its size cannot (Alg. 4's cost stays one
    routing per sync, plus one), while a larger one is still tried."""
    mgr = StalenessManager(eta=0, batch_size=16, group_size=8, start_version=1)  # 2 groups, version 1 only
    budgets = []

    def plan_budget():
        budgets.append(1)
        return copy.deepcopy(mgr)

    loads = [load(i, running=8 * i, kv=800.0 * i, cap=16) for i in range(6)]
    trajs = [group(f"g{k}") for k in range(4)]
    assert to_sync(loads, trajs, 1, MODEL, plan_budget, mgr.can_reserve, mu=0.3) == [0]  # it takes both
    assert len(budgets) == 3  # the baseline, the accepted candidate, the first that did not help
    budgets.clear()
    bigger = [*loads[:5], load(5, running=40, kv=4000.0, cap=64)]
    assert to_sync(bigger, trajs, 1, MODEL, plan_budget, mgr.can_reserve, mu=0.3) == [0]
    assert len(budgets) == 4  # the larger candidate is still tried
