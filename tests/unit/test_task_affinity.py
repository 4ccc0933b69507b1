"""Instance pools and task affinity: config validation and the pure eligibility policy
(``services.common.pool_config``, ``services.generation.scheduling.pools``)."""

from __future__ import annotations

import random

import pytest

from services.common.config import ConfigError, GenerationConfig, load_config
from services.common.pool_config import task_problem
from services.common.types import GenerateParams, PromptSpec
from services.generation import convert
from services.generation.scheduling import DispatchContext, InstanceLoad, SeqRequest, dispatch
from services.generation.scheduling.pools import (
    AffinityError,
    eligible_instances,
    last_of_routed_pool,
    merge_plans,
    pool_of_instance,
    split_by_pool,
)
from services.generation.server import RequestError, validate_request
from services.rollout.routing import InstanceView, pick_instance

POOLS = ("generation.pools=[{name: compute, hardware: H800, instances: [0]}, "
         "{name: bandwidth, hardware: H20, instances: [1, 2]}]")
BASE = ["generation.instances=3", POOLS]


def gen(affinity: dict[str, str] | None = None, **extra) -> GenerationConfig:
    return GenerationConfig.model_validate({
        "instances": 3, "pools": [{"name": "compute", "hardware": "H800", "instances": [0]},
                                  {"name": "bandwidth", "hardware": "H20", "instances": [1, 2]}],
        "affinity": affinity or {}, **extra,
    })


def test_pools_and_affinity_load_and_default_changes_nothing():
    cfg = load_config(None, [*BASE, "generation.affinity={calculator: compute, default: bandwidth}"]).generation
    assert [p.name for p in cfg.pools] == ["compute", "bandwidth"] and cfg.affinity["default"] == "bandwidth"
    plain = load_config(None).generation
    assert plain.pools == [] and plain.affinity == {} and plain.scaleout_pool == ""
    assert eligible_instances("anything", plain, [0, 3]) == [0, 3]


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["generation.affinity={calculator: nope}"],
         "task 'calculator' maps to pool 'nope', not one of ['compute', 'bandwidth']"),
        (["generation.pools=[{name: a, instances: [0, 1]}, {name: a, instances: [2]}]"],
         "pool names must be unique, got ['a', 'a']"),
        (["generation.pools=[{name: a, instances: [0, 1]}, {name: b, instances: [1, 2]}]"],
         "instance 1 is in both pool 'a' and pool 'b'"),
        (["generation.pools=[{name: a, instances: [0, 1]}]"], "instances [2] are in no pool"),
        (["generation.pools=[{name: a, instances: [0, 1, 2, 3]}]"], "pool 'a' lists instance 3, outside [0, 3)"),
        (["generation.pools=[{name: a, instances: [0, 0, 1, 2]}]"], "instances [0] are listed more than once"),
        (["generation.pools=[{name: a, instances: []}, {name: b, instances: [0, 1, 2]}]"],
         "generation.pools.0.instances"),
        (["generation.pools=[{name: 'a b', instances: [0, 1, 2]}]"], "generation.pools.0.name"),
        (["generation.pools=[]", "generation.affinity={x: a}"],
         "generation.affinity ({'x': 'a'}) needs generation.pools"),
        (["generation.affinity={'a b': compute}"], "key 'a b': task tag may hold only letters"),
        (["generation.scaleout_pool=zzz"], "generation.scaleout_pool 'zzz' is not one of the pools"),
    ],
)
def test_invalid_pools_name_the_offending_values(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        load_config(None, BASE + overrides)
    assert fragment in str(err.value)


def test_unknown_pool_hardware_fails_when_a_run_is_prepared():
    from flows.registries import check_registries

    cfg = load_config(None, [*BASE, "generation.pools=[{name: a, hardware: A100, instances: [0, 1, 2]}]"])
    with pytest.raises(ConfigError) as err:
        check_registries(cfg)  # the schema knows no registry
    assert "unknown hardware 'A100'; known: ['H100', 'H20', 'H800', 'cpu-local']" in str(err.value)


def test_one_instance_with_the_router_on_may_use_affinity():
    cfg = load_config(None, ["generation.pools=[{name: a, instances: [0]}]", "generation.affinity={x: a}",
                             "generation.dispatch.router='on'"])
    assert cfg.generation.affinity == {"x": "a"}


@pytest.mark.parametrize("task, ok", [
    ("", True), ("calculator", True), ("gem-math:v2.1_x", True), ("a" * 64, True),
    ("a" * 65, False), ("a b", False), ("x/y", False), ("é", False), ("\n", False),
])
def test_task_tag_charset_and_length(task, ok):
    assert (task_problem(task) is None) == ok


def test_task_is_validated_at_the_edge_and_survives_the_wire():
    cfg = GenerationConfig()
    ok = {"vocab_size": 19, "max_positions": 512}
    validate_request([PromptSpec("p", (1, 2), task="frozenlake")], GenerateParams(max_new_tokens=4), cfg, **ok)
    with pytest.raises(RequestError, match=r"prompt 'p': task tag may hold only"):
        validate_request([PromptSpec("p", (1, 2), task="bad tag")], GenerateParams(max_new_tokens=4), cfg, **ok)
    wire = convert.request_to_pb([PromptSpec("p", (1, 2), task="calc")], GenerateParams())
    prompts, _ = convert.request_from_pb(wire)
    assert prompts[0].task == "calc" and PromptSpec("q", (1,)).task == ""


def test_eligible_instances_follow_the_affinity_map():
    cfg = gen({"calculator": "compute", "default": "bandwidth"})
    assert eligible_instances("calculator", cfg, [0, 1, 2]) == [0]
    assert eligible_instances("math", cfg, [0, 1, 2]) == [1, 2]  # default
    assert eligible_instances("", cfg, [2, 1, 0]) == [2, 1]  # untagged = default; open-slot order kept
    assert eligible_instances("math", cfg, [0, 2]) == [2]  # instance 1 closed
    assert eligible_instances("x", gen(), [0, 1, 2]) == [0, 1, 2]  # pools without affinity: labels only


def test_no_pool_or_empty_pool_is_refused_naming_task_and_pool():
    cfg = gen({"calculator": "compute"})
    with pytest.raises(AffinityError) as err:
        eligible_instances("math", cfg, [0, 1, 2])
    assert "task 'math' has no pool: generation.affinity lists ['calculator'] and no 'default'" in str(err.value)
    with pytest.raises(AffinityError) as err:
        eligible_instances("calculator", cfg, [1, 2])
    assert "task 'calculator' maps to pool 'compute', which has no open instance" in str(err.value)
    assert "(open instances: [1, 2])" in str(err.value)


def test_instances_added_at_run_time_join_the_scaleout_pool():
    assert pool_of_instance(3, gen()) == "compute"  # default: the first pool
    cfg = gen({"math": "bandwidth", "calculator": "compute"}, scaleout_pool="bandwidth")
    assert pool_of_instance(0, cfg) == "compute" and pool_of_instance(4, cfg) == "bandwidth"
    assert eligible_instances("math", cfg, [0, 2, 4]) == [2, 4]
    assert pool_of_instance(0, GenerationConfig()) is None


def test_last_instance_of_a_routed_pool_is_protected():
    cfg = gen({"calculator": "compute", "default": "bandwidth"})
    assert last_of_routed_pool(0, cfg, [0, 1, 2]) == "compute"
    assert last_of_routed_pool(1, cfg, [0, 1, 2]) is None and last_of_routed_pool(2, cfg, [0, 2]) == "bandwidth"
    assert last_of_routed_pool(0, gen({"x": "bandwidth"}), [0, 1, 2]) is None  # no task routes to compute
    assert last_of_routed_pool(0, GenerationConfig(instances=3), [0, 1, 2]) is None


def _seqs(tasks: list[str]) -> list[SeqRequest]:
    return [SeqRequest(f"s{k}", 4, float(10 + k), group=f"s{k}") for k in range(len(tasks))]


@pytest.mark.parametrize("policy", ["round_robin", "least_loaded", "lpt", "random"])
def test_per_pool_dispatch_keeps_every_sequence_in_its_pool(policy):
    cfg = GenerationConfig.model_validate({
        "instances": 5, "scaleout_pool": "b",
        "pools": [{"name": "a", "instances": [0, 3]}, {"name": "b", "instances": [1, 2, 4]}],
        "affinity": {"calc": "a", "walk": "a", "default": "b"},
    })
    rng = random.Random(7)
    for trial in range(20):
        tasks = [rng.choice(["calc", "walk", "math", ""]) for _ in range(rng.randint(1, 12))]
        open_slots = [0, 1, 3, 5, 6] if trial % 2 else [0, 1, 2, 3, 4]
        shares = split_by_pool(tasks, cfg, open_slots)
        seqs = _seqs(tasks)
        parts = [(s, dispatch(policy, [seqs[k] for k in s.members],
                              DispatchContext(tuple(InstanceLoad(j) for j in range(len(s.slots))), seed=trial)))
                 for s in shares]
        plan = merge_plans(parts)
        assert sorted(plan.assignment) == sorted(s.seq_id for s in seqs)
        for k, task in enumerate(tasks):
            assert plan.assignment[f"s{k}"] in eligible_instances(task, cfg, open_slots)
        assert sum(len(s.members) for s in shares) == len(tasks)


def test_without_affinity_the_merged_plan_is_the_single_plan_mapped_to_slots():
    seqs = _seqs(["x"] * 5)
    shares = split_by_pool(["x"] * 5, GenerationConfig(), [0, 2, 5])
    assert len(shares) == 1 and shares[0].pool is None and shares[0].slots == (0, 2, 5)
    plan = dispatch("round_robin", seqs, DispatchContext(tuple(InstanceLoad(j) for j in range(3)), rotation=1))
    merged = merge_plans([(shares[0], plan)])
    assert merged.assignment == {s: (0, 2, 5)[k] for s, k in plan.assignment.items()} and merged.notes == plan.notes


def test_pick_instance_honours_an_eligibility_filter_and_is_unchanged_without():
    views = [InstanceView(0, 1, 0, 4), InstanceView(1, 1, 2, 4), InstanceView(2, 0, 3, 4)]
    always = lambda v: True  # noqa: E731
    assert pick_instance(None, views, always).index == 2  # oldest version first
    assert pick_instance(None, views, always, eligible=[0, 1]).index == 0  # then least loaded, within the pool
    assert pick_instance(None, views, always, eligible=[]) is None
    cfg = gen({"calculator": "compute", "default": "bandwidth"})
    assert pick_instance(None, views, always, eligible=eligible_instances("math", cfg, [0, 1, 2])).index == 2
