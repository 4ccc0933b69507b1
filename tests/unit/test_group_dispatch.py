"""The dispatch policies over the orchestrator's new groups (services/rollout/dispatching.py):
placed within the version and pool the staleness protocol allows, never past capacity, and the
estimator's failures cost estimates, never the run."""

from __future__ import annotations

import pytest

from services.common.config import load_config
from services.rollout.dispatching import GroupDispatcher, NewGroup
from services.rollout.fleet import fleet_of
from services.rollout.routing import InstanceView


class Lengths:
    def predict(self, prompts):
        return [float(len(p)) for p in prompts]


class Broken:
    def predict(self, prompts):
        raise ValueError("no model")


def _dispatcher(estimator, policy="lpt"):
    gen = load_config(None, [f"generation.dispatch.policy={policy}"]).generation
    return GroupDispatcher(gen, lambda: estimator)


def test_lpt_spreads_the_longest_groups_over_the_instances_of_their_version():
    d = _dispatcher(Lengths())
    est = d.estimates(["x" * 90, "x" * 80, "x" * 10, "x" * 5])
    assert est == [90.0, 80.0, 10.0, 5.0]
    groups = [NewGroup(f"g{i}", 4, e, 2) for i, e in enumerate(est)]
    views = [InstanceView(0, 1, 0, 100), InstanceView(1, 1, 0, 100), InstanceView(2, 0, 0, 100)]
    first = [views[0]] * 4  # the pick put every group on instance 0 at version 1
    t = d.plan_round(groups, first, [None] * 4, views, capacity=100)
    assert t["g0"] != t["g1"] and {t["g0"], t["g1"]} == {0, 1}  # the two long ones apart
    assert set(t.values()) <= {0, 1}  # never instance 2: it runs version 0, not the groups' V_traj
    fleet = fleet_of(["a", "b", "c"], 100)  # each group's samples book their estimated work on the table
    booked = [fleet.reserve(t[g.key], g.samples, work=g.estimate) for g in groups]
    assert sum(r.work for r in fleet.snapshot().rows) == 2 * sum(est)
    assert [v.work for v in fleet.views()][2] == 0.0 and sum(v.work for v in fleet.views()) == 2 * sum(est)
    for res in booked:
        fleet.release(res, 1)  # one sample of each returned: its estimate is no longer outstanding
    assert sum(r.work for r in fleet.snapshot().rows) == sum(est)


def test_the_policy_reads_each_instances_outstanding_work_from_its_view():
    d = _dispatcher(Lengths(), policy="lpt")
    views = [InstanceView(0, 0, 2, 100, work=500.0), InstanceView(1, 0, 2, 100, work=20.0)]
    assert d.plan_round([NewGroup("g", 4, 10.0, 2)], [views[0]], [None], views, capacity=100) == {"g": 1}


def test_a_loss_zeroes_an_instances_work_and_a_late_release_leaves_its_next_incarnation_alone():
    fleet = fleet_of(["a"], 100)
    res = fleet.reserve(0, 4, work=30.0)
    assert fleet.snapshot()[0].work == 120.0
    fleet.mark_lost(0, "gone")
    fleet.mark_live(0, 1)
    again = fleet.reserve(0, 2, work=10.0)
    assert not fleet.release(res, 4)  # the old incarnation's samples came back late
    assert fleet.snapshot()[0].work == 20.0
    assert fleet.release(again) and fleet.snapshot()[0].work == 0.0


def test_placement_respects_pools_and_capacity():
    d = _dispatcher(Lengths())
    groups = [NewGroup("a", 4, 50.0, 4), NewGroup("b", 4, 40.0, 4)]
    views = [InstanceView(0, 0, 0, 8), InstanceView(1, 0, 6, 8), InstanceView(2, 0, 0, 8)]
    t = d.plan_round(groups, [views[0], views[0]], [[0, 1], [0, 1]], views, capacity=8)
    assert t == {"a": 0, "b": 0}  # instance 2 is outside the pool; instance 1 has no room for 4 more


def test_a_failing_estimator_costs_estimates_only_and_finished_samples_feed_the_history():
    d = _dispatcher(Broken())
    assert d.estimates(["a", "b"]) == [None, None] and d.failures == 1
    assert _dispatcher(None).estimates(["a"]) == [None]
    d.finished(30.0, 25)
    d.finished(30.0, 0)  # cancelled: adds no length
    assert len(d.lengths) == 1 and list(d.pairs) == [(30.0, 25.0)]


def test_metrics_name_the_ranker_version_the_groups_were_placed_with():
    gen = load_config(None, []).generation
    live = {"name": None}
    d = GroupDispatcher(gen, lambda: Lengths(), version=lambda: live["name"])
    assert d.metrics()["ranker_version"] is None
    live["name"] = "r-2"  # the store's watcher swapped rankers
    assert d.metrics()["ranker_version"] == "r-2"
    assert "ranker_version" not in _dispatcher(Lengths()).metrics()  # an estimator without versions


def test_least_tokens_places_by_the_tokens_each_instance_reports():
    gen = load_config(None, ["generation.dispatch.policy=least_tokens", "generation.dispatch.min_history=2",
                             "generation.num_blocks=100", "generation.page_size=10"]).generation
    state = {0: (0.9, 0), 1: (0.1, 2), 2: None}  # instance 2 does not answer
    d = GroupDispatcher(gen, lambda: None, probe=state.get)
    for n in (40, 60):
        d.finished(None, n)  # mean recent length 50
    assert d.tokens_in_flight(0, 8, 50.0) == 900.0  # 90% of 1000 KV tokens
    assert d.tokens_in_flight(1, 8, 50.0) == 100.0 + 2 * 50.0  # its KV plus two queued samples at the mean
    assert d.tokens_in_flight(2, 3, 50.0) == 150.0  # no answer: its outstanding samples at the mean
    views = [InstanceView(0, 0, 1, 100), InstanceView(1, 0, 8, 100), InstanceView(2, 0, 3, 100)]
    t = d.plan_round([NewGroup("g", 4, None, 2)], [views[0]], [None], views, capacity=100)
    assert t == {"g": 2}  # fewest tokens (150), though it is not the one with fewest samples (instance 0)
    assert d.given([12.0, None, 0.0]) == [12.0, None, None]


class _Item:
    def __init__(self, pid: str, prompt: str) -> None:
        self.prompt_id, self.prompt = pid, prompt


def test_a_step_starts_longest_estimate_first_and_each_group_is_estimated_once():
    from services.rollout.dispatching import GroupEstimates

    calls = []

    class Counting(Lengths):
        def predict(self, prompts):
            calls.append(list(prompts))
            return super().predict(prompts)

    d = _dispatcher(Counting())
    est = GroupEstimates(d)
    items = [_Item("a", "x" * 5), _Item("b", "x" * 50), _Item("c", "x" * 20)]
    ordered = est.launch_order(lambda n: items[:n])
    assert [p.prompt_id for p in ordered(3)] == ["b", "c", "a"]  # longest estimate first
    assert est.take(items[:2]) == [5.0, 50.0] and len(calls) == 1  # placement reuses the launch-time estimates
    assert est.take(items[:1]) == [5.0] and len(calls) == 2  # forgotten once placed: asked again
    assert d.estimated == 3  # counted when placed: b and a, then a again


def test_launch_order_keeps_the_task_order_without_estimates_and_puts_unestimated_first():
    from services.rollout.dispatching import GroupEstimates

    items = [_Item("a", "x"), _Item("b", "xx")]
    assert [p.prompt_id for p in GroupEstimates(_dispatcher(None)).launch_order(lambda n: items)(2)] == ["a", "b"]

    class Partly:
        def predict(self, prompts):
            return [None if len(p) == 1 else 9.0 for p in prompts]

    items = [_Item("b", "xx"), _Item("a", "x")]
    assert [p.prompt_id for p in GroupEstimates(_dispatcher(Partly())).launch_order(lambda n: items)(2)] == ["a", "b"]


def test_one_instance_without_a_router_estimates_with_the_ranker_store(tmp_path):
    """generation.ranker_dir with one instance: the orchestrator still builds its dispatcher over the
    store's ranker, so a batch starts longest estimate first and each estimate rides with its prompt."""
    from types import SimpleNamespace

    from ranker.base import create
    from ranker.store import RankerStore
    from services.rollout.dispatching import GroupEstimates, build_dispatcher
    from services.rollout.orchestrator import engines_behind

    RankerStore(tmp_path / "store").publish(create("prompt_length").fit(["a", "bbbbbbbb"], [5, 9]).save(tmp_path / "r"))
    cfg = load_config(None, [f"generation.ranker_dir={tmp_path / 'store'}"])
    assert cfg.generation.instances == 1 and not cfg.uses_router
    trainer = SimpleNamespace(cfg=cfg, clients=[None], model_dir=None)  # what build_dispatcher reads
    d = build_dispatcher(trainer, engines_behind(cfg, 1))
    assert d is not None
    items = [_Item("a", "x"), _Item("b", "x" * 40), _Item("c", "x" * 8)]
    assert [p.prompt_id for p in GroupEstimates(d).launch_order(lambda n: items)(3)] == ["b", "c", "a"]
    assert d.version() == RankerStore(tmp_path / "store").current().name  # the metrics name the store's version


def test_emulated_instances_are_planned_with_the_profile_they_wait_out(tmp_path):
    """streamrl's cost model for an emulated fleet is the emulated hardware's profile (an H20 serving
    Qwen2.5-7B), not the served tiny checkpoint's CPU profile."""
    from services.common.config import load_config as load
    from services.generation.emulated_engine import resolve_profile
    from services.generation.router_main import CPU_PROFILE, load_spec
    from services.generation.scheduling.profiles import load_profile, shipped_profile
    from tests.conftest import ROOT

    gen = load(ROOT / "deploy/configs/emulated.yaml", ["generation.dispatch.policy=streamrl"]).generation
    spec = load_spec(gen, str(tmp_path))  # nothing is read from the checkpoint
    limits = {"max_batch": gen.max_inflight, "kv_capacity_tokens": gen.num_blocks * gen.page_size}
    assert spec == resolve_profile(gen.emulation.profile).instance_spec(**limits)
    assert spec.cost != load_profile(shipped_profile(CPU_PROFILE)).instance_spec(**limits).cost


def test_the_router_has_a_thread_for_every_call_its_instances_admit():
    """32 emulated H20 instances admitting 64 sequences each: the orchestrator may hold 256 group calls
    open on the router (2048 one-sample calls at most), more than the 32 threads it once had."""
    from services.common.config import load_config as load
    from services.generation.router_main import router_workers
    from tests.conftest import ROOT

    cfg = load(ROOT / "deploy/configs/emulated.yaml", ["generation.dispatch.router=on"])
    assert router_workers(cfg) >= 32 * 64
    scaled = load(ROOT / "deploy/configs/emulated.yaml", ["scaleout.enabled=true", "scaleout.max_instances=40"])
    assert router_workers(scaled) >= 40 * 64


class _Recording(GroupDispatcher):
    """The live dispatcher, recording the instances each ``place`` call is offered."""

    offered: list[list[int]]

    def place(self, groups, candidates):
        self.offered.append([v.index for v in candidates])
        return super().place(groups, candidates)


def test_only_instances_with_room_are_offered_to_the_policy():
    """At fleet scale a step's later groups start as earlier ones finish, when one or two of 32
    instances have room: the policy plans over those, not over every instance of the version
    (a plan onto a full one would be overruled, after Algorithm 2 paid for it)."""
    gen = load_config(None, ["generation.dispatch.policy=least_loaded"]).generation
    d = _Recording(gen, lambda: None)
    d.offered = []
    views = [InstanceView(i, 0, 8 if i % 2 else 0, 8) for i in range(6)]  # 1, 3, 5 full
    groups = [NewGroup(f"g{k}", 4, None, 8) for k in range(3)]
    t = d.plan_round(groups, [views[0], views[2], views[4]], [None] * 3, views, capacity=8)
    assert d.offered == [[0, 2, 4]] and sorted(t.values()) == [0, 2, 4]
    d.plan_round(groups[:1], [views[0]], [None], [*views[:1], *(InstanceView(i, 0, 8, 8) for i in range(1, 6))], 8)
    assert d.offered == [[0, 2, 4]]  # one instance with room: nothing to plan, the group stays where it was picked


class _Draw:
    """A task item as the samplers draw it: a new prompt id every draw, the same text on a revisit."""

    def __init__(self, pid: str, prompt: str) -> None:
        self.prompt_id, self.prompt, self.task, self.system = pid, prompt, "t", None


def test_run_signals_estimate_a_revisit_from_its_history_and_score_the_makespans():
    """generation.dispatch.run_signals: a prompt's second visit is estimated from its first (its text
    prior says nothing); a dropped group leaves no history; the run reports recall@20%."""
    from types import SimpleNamespace

    from services.rollout.dispatching import build_dispatcher, group_estimates

    cfg = load_config(None, ["generation.dispatch.run_signals.enabled=true"])
    d = build_dispatcher(SimpleNamespace(cfg=cfg, clients=[None], model_dir=None), 1)
    assert d is not None  # no ranker, yet the run's own estimates make a dispatcher
    est = group_estimates(d, None, cfg.generation.dispatch.run_signals, 4, 512)
    first = [_Draw(f"a{i}", f"q{i}") for i in range(20)]
    assert est.take(first) == [None] * 20  # nothing known yet
    for i, p in enumerate(first):
        for n in (10 * (i + 1),) * 4:
            est.finished(p.prompt_id, n)
        est.close(p.prompt_id, complete=i != 0)  # q0's group was dropped: no history
    again = [_Draw(f"b{i}", f"q{i}") for i in range(20)]
    values = est.take(again)
    assert values[1] < values[0] < values[19]  # q0 has no history: the run's mean length
    assert values[1:] == sorted(values[1:]) and values[19] > 3 * values[2]  # each revisit from its own history
    assert est.revisits == 19
    before = est.remaining_work("b19")
    est.finished("b19", 400)  # a first sibling far longer than its history: the rest, still running, are longer
    assert est.remaining_work("b19") == pytest.approx(400.0) and before < 400 and est.remaining_work("nope") is None
    est.finished("b19", 200)  # (the rest of the group as before)
    for i, p in enumerate(again):
        for n in (10 * (i + 1),) * (4 if i < 19 else 2):
            est.finished(p.prompt_id, n)
        est.close(p.prompt_id, complete=True)
    m = est.metrics()
    assert m["run_signals_recall_at_20"] == 1.0 and m["run_signals_revisits"] == 19
    off = group_estimates(d, None, load_config(None, []).generation.dispatch.run_signals, 4, 512)
    assert off.run is None and off.metrics() == {}
