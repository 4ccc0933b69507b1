"""Dispatch and admission policies on hand-made cases with known answers, and LPT's 4/3 bound."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.generation.scheduling import (
    AdmissionQueue,
    DispatchContext,
    EstimateErrorModel,
    InstanceLoad,
    InstanceSpec,
    Job,
    LengthDistribution,
    SeqRequest,
    StepCost,
    calibrate,
    dispatch,
    run_instance,
)

UNIT = StepCost(k1=0.0, k2=0.0, k3=0.0, k4=1.0, kv_bytes_per_token=1.0)  # one second per step, whatever the batch


def slots(m: int) -> InstanceSpec:
    """An instance that is exactly P||Cmax with m machines: m batch slots, unit step cost, no KV limit."""
    return InstanceSpec(UNIT, kv_capacity_tokens=10**9, max_batch=m)


def ctx(n: int, **kw) -> DispatchContext:
    return DispatchContext(instances=tuple(InstanceLoad(i) for i in range(n)), **kw)


def opt_makespan(lengths: list[int], m: int) -> int:
    best = sum(lengths)
    for assign in itertools.product(range(m), repeat=len(lengths)):
        loads = [0] * m
        for x, b in zip(lengths, assign, strict=True):
            loads[b] += x
        best = min(best, max(loads))
    return best


# ---------------------------------------------------------------------------- admission
def test_lpt_queue_orders_longest_first_unknown_and_resumed_ahead():
    q = AdmissionQueue("lpt", lambda x: x[1])
    for item in [("a", 5.0), ("b", None), ("c", 50.0), ("d", 20.0), ("e", None)]:
        q.push(item)
    q.push(("r", 1.0), resumed=True)
    assert [x[0] for x in q] == ["r", "b", "e", "c", "d", "a"]
    assert [x[0] for x in q.pop(3, eligible=lambda x: x[0] != "b")] == ["r", "e", "c"]
    assert [x[0] for x in q.remove_if(lambda x: x[0] == "a")] == ["a"]
    assert [x[0] for x in q.pop(10)] == ["b", "d"]


def test_fcfs_queue_keeps_arrival_order():
    q = AdmissionQueue("fcfs", lambda x: x)
    q.extend([3.0, 1.0, 2.0])
    assert q.pop(3) == [3.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="admission order"):
        AdmissionQueue("sjf", lambda x: x)  # type: ignore[arg-type]


def test_lpt_admission_reaches_the_optimum_fcfs_misses():
    jobs = [Job(f"j{i}", 0, n, float(n)) for i, n in enumerate([1, 1, 1, 1, 4])]  # the long one arrives last
    assert run_instance(jobs, slots(2), "fcfs").makespan_s == 6  # 2 rounds of short ones, then the long one
    assert run_instance(jobs, slots(2), "lpt").makespan_s == 4 == opt_makespan([1, 1, 1, 1, 4], 2)


def test_lpt_admission_on_grahams_tight_case():
    lengths = [3, 3, 2, 2, 2]  # OPT 6 ({3,3} | {2,2,2}); LPT 7 = (4/3 - 1/6) x OPT, the worst case for m = 2
    run = run_instance([Job(f"j{i}", 0, n, float(n)) for i, n in enumerate(lengths)], slots(2), "lpt")
    assert opt_makespan(lengths, 2) == 6 and run.makespan_s == 7


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=7), st.integers(1, 3))
def test_lpt_admission_within_four_thirds_of_optimal(lengths, m):
    run = run_instance([Job(f"j{i}", 0, n, float(n)) for i, n in enumerate(lengths)], slots(m), "lpt")
    assert run.makespan_s <= (4 / 3 - 1 / (3 * m)) * opt_makespan(lengths, m) + 1e-9


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=7), st.integers(1, 3))
def test_global_lpt_dispatch_within_four_thirds_of_optimal(lengths, m):
    seqs = [SeqRequest(f"s{i}", 0, float(n)) for i, n in enumerate(lengths)]
    plan = dispatch("lpt", seqs, ctx(m))
    loads = [0] * m
    for s, n in zip(seqs, lengths, strict=True):
        loads[plan.assignment[s.seq_id]] += n
    assert max(loads) <= (4 / 3 - 1 / (3 * m)) * opt_makespan(lengths, m) + 1e-9


# ---------------------------------------------------------------------------- dispatch
def test_baselines():
    seqs = [SeqRequest(f"s{i}", 10 * (i + 1)) for i in range(6)]
    assert list(dispatch("round_robin", seqs, ctx(3, rotation=1)).assignment.values()) == [1, 2, 0, 1, 2, 0]
    loaded = DispatchContext(instances=(InstanceLoad(0, outstanding=4), InstanceLoad(1),
                                        InstanceLoad(2, outstanding=1)))
    assert list(dispatch("least_loaded", seqs, loaded).assignment.values()) == [1, 2, 1, 2, 1, 2]
    a, b = dispatch("random", seqs, ctx(3, seed=7)), dispatch("random", seqs, ctx(3, seed=7))
    assert a.assignment == b.assignment and set(a.assignment.values()) <= {0, 1, 2}


def test_least_tokens_joins_the_queue_with_fewest_tokens_in_flight():
    seqs = [SeqRequest(f"s{i}", 10) for i in range(4)]
    # instance 0 holds few sequences but many tokens (long ones), instance 1 many short ones
    loaded = DispatchContext(instances=(InstanceLoad(0, outstanding=2, tokens=900.0),
                                        InstanceLoad(1, outstanding=6, tokens=300.0)),
                             lengths=LengthDistribution([190.0, 210.0]))
    plan = dispatch("least_tokens", seqs, loaded)
    # each sequence adds 10 + 200 tokens: 300 -> 510 -> 720 -> 930 on instance 1, then 0 (900 < 930)
    assert list(plan.assignment.values()) == [1, 1, 1, 0]
    assert list(dispatch("least_loaded", seqs, loaded).assignment.values()) == [0, 0, 0, 0]
    # idle instances: no history, no tokens -> spread by count like least_loaded
    assert list(dispatch("least_tokens", seqs, ctx(2)).assignment.values()) == [0, 1, 0, 1]


def test_global_lpt_balances_estimated_work():
    seqs = [SeqRequest(f"s{i}", 0, e) for i, e in enumerate([2.0, 7.0, 3.0, 5.0, 4.0, 6.0])]
    plan = dispatch("lpt", seqs, ctx(2))
    loads = [0.0, 0.0]
    for s in seqs:
        loads[plan.assignment[s.seq_id]] += s.estimate or 0
    assert loads == [14.0, 13.0]  # 7,4,3 | 6,5,2 (OPT is 14/13 too)


def test_estimate_driven_policies_fall_back_to_round_robin_without_estimates():
    seqs = [SeqRequest(f"s{i}", 5) for i in range(4)]
    plan = dispatch("lpt", seqs, ctx(2))
    assert list(plan.assignment.values()) == [0, 1, 0, 1] and "round_robin" in str(plan.notes["fallback"])
    with pytest.raises(ValueError, match="needs an instance cost model"):
        dispatch("streamrl", seqs, ctx(2))
    with pytest.raises(ValueError, match="unknown dispatch policy"):
        dispatch("fastest", seqs, ctx(2))


def test_prompt_unit_keeps_groups_whole_and_balances_their_work():
    sizes = {"g0": (4, 10.0), "g1": (4, 9.0), "g2": (2, 20.0), "g3": (8, 1.0)}  # group -> (samples, estimate)
    seqs = [SeqRequest(f"{g}/{k}", 4, e, group=g) for g, (n, e) in sizes.items() for k in range(n)]
    for policy in ("random", "round_robin", "lpt"):
        plan = dispatch(policy, seqs, ctx(2, unit="prompt"))
        for g in sizes:
            assert len({plan.assignment[s.seq_id] for s in seqs if s.group == g}) == 1, (policy, g)
    plan = dispatch("lpt", seqs, ctx(2, unit="prompt"))
    work = [0.0, 0.0]
    for s in seqs:
        work[plan.assignment[s.seq_id]] += s.estimate or 0
    assert sorted(work) == [48.0, 76.0]  # group work 40, 40, 36, 8 -> {40, 36} | {40, 8}: the optimum
    assert plan.notes["unit"] == "prompt"


def batched_spec(max_batch: int = 64) -> InstanceSpec:
    """A step of n sequences costs max(0.1, 0.01 n) seconds (memory-bound below 10, compute-bound above)."""
    return InstanceSpec(StepCost(0.0, 0.1, 0.01, 0.0, 1.0), kv_capacity_tokens=10**9, max_batch=max_batch)


def test_refined_streamrl_gives_the_long_tail_its_own_instance():
    # One 1000-token sample and 64 of 50 tokens on 2 instances. Balancing work (global LPT)
    # batches the long one with 22 short ones: 50 x 0.23 + 950 x 0.1 = 106.5 s. Alone it takes
    # 1000 x 0.1 = 100 s while the other instance finishes the 64 short ones in 50 x 0.64 = 32 s.
    seqs = [SeqRequest("long", 4, 1000.0)] + [SeqRequest(f"s{i}", 4, 50.0) for i in range(64)]
    c = ctx(2, spec=batched_spec())
    plan = dispatch("streamrl", seqs, c)
    inst = plan.assignment["long"]
    assert [s for s, b in plan.assignment.items() if b == inst] == ["long"]
    assert plan.long_instances == (0,) and plan.long_tail == frozenset({"long"})
    assert plan.predicted_makespan_s == pytest.approx(100.0, rel=0.01)
    lpt = dispatch("lpt", seqs, c)
    jobs = [[Job(s.seq_id, 4, int(s.estimate or 1), s.estimate) for s in seqs if lpt.assignment[s.seq_id] == b]
            for b in (0, 1)]
    assert max(run_instance(j, c.spec, "lpt").makespan_s for j in jobs) == pytest.approx(106.5, rel=0.01)  # type: ignore[arg-type]


def test_streamrl_naive_splits_long_tail_and_regular_instances():
    seqs = [SeqRequest(f"s{i}", 4, float(i + 1)) for i in range(100)]
    plan = dispatch("streamrl_naive", seqs, ctx(4, spec=batched_spec(), alpha=0.2))
    assert len(plan.long_tail) == 20 and {f"s{i}" for i in range(80, 100)} == plan.long_tail
    assert {plan.assignment[s] for s in plan.long_tail} == set(plan.long_instances)
    regular = {plan.assignment[s.seq_id] for s in seqs if s.seq_id not in plan.long_tail}
    assert regular.isdisjoint(plan.long_instances) and len(regular) + len(plan.long_instances) == 4


def test_refined_streamrl_does_not_trust_a_useless_ranker():
    # The estimates carry no information (history: actual lengths independent of the estimate),
    # so dedicating an instance to the "predicted long" ones cannot pay: plain balancing wins.
    rng = random.Random(0)
    history = [(rng.random(), rng.choice([50.0, 50.0, 50.0, 1000.0])) for _ in range(400)]
    seqs = [SeqRequest(f"s{i}", 4, rng.random()) for i in range(64)]
    plan = dispatch("streamrl", seqs, ctx(2, spec=batched_spec(), errors=EstimateErrorModel(history), scenarios=3))
    assert plan.notes["n_long"] == 0


# ---------------------------------------------------------------------------- lengths
def test_calibration_maps_ranks_onto_the_distribution():
    dist = LengthDistribution([10, 20, 30, 40, 1000])
    out = calibrate([0.3, None, 0.9, 0.1], dist)
    assert out[3] < out[0] < out[2] and out[1] == dist.p50
    assert out[2] > 300  # the top estimate gets a long-tail length
    assert calibrate([2.0, None], None) == [2.0, 2.0]


def test_error_model_expected_lengths():
    perfect = EstimateErrorModel([(float(x), float(x)) for x in range(1, 201)], bandwidth=0.02, min_pool=2)
    assert perfect.expected(150.0) == pytest.approx(150.0, abs=3)
    rng = random.Random(1)
    useless = EstimateErrorModel([(rng.random(), float(rng.randint(1, 100))) for _ in range(2000)], bandwidth=0.5)
    assert useless.expected(0.99) == pytest.approx(50.5, abs=6) and useless.expected(0.01) == pytest.approx(50.5, abs=6)
    assert len(useless.scenarios([0.5, 0.9], k=3, seed=0)) == 3


# ---------------------------------------------------------------------------- cost and instance model
@settings(max_examples=40, deadline=None)
@given(st.integers(1, 64), st.integers(0, 5000), st.integers(1, 50))
def test_closed_form_steps_equal_the_sum_of_steps(n, kv, k):
    cost = StepCost(k1=1e-9, k2=0.004, k3=1e-4, k4=0.002, kv_bytes_per_token=2048, k5=1e-8)
    assert cost.steps(n, kv, k) == pytest.approx(sum(cost.step(n, kv + n * j) for j in range(k)))


def test_single_sequence_time_is_prefill_plus_its_steps():
    cost = StepCost(k1=1e-6, k2=0.01, k3=0.001, k4=0.002, kv_bytes_per_token=1.0, prefill_per_token=0.001)
    run = run_instance([Job("a", 10, 100)], InstanceSpec(cost, 10**6, 8), "fcfs")
    assert run.makespan_s == pytest.approx(0.01 + sum(cost.step(1, 10 + j) for j in range(100)))
    assert run.tokens == 100 and run.steps == 100


def test_kv_overflow_preempts_the_newest_and_everything_finishes():
    spec = InstanceSpec(UNIT, kv_capacity_tokens=100, max_batch=8)
    jobs = [Job(f"j{i}", 5, 40, 40.0) for i in range(4)]  # 4 x 45 tokens do not fit in 100
    run = run_instance(jobs, spec, "lpt", trace=True)
    assert set(run.finish_s) == {j.seq_id for j in jobs} and run.preemptions >= 1
    assert all(kv <= 100 for _, n, kv in run.trace if n > 1)
    assert run.tokens >= 160  # every token generated (a preempted sequence keeps its progress)
