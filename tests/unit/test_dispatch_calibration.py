"""allocator.simulator.calibrate_spec: the closed-form scale fit of a profile to a measured run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from allocator.simulator import MeasuredInstance, calibrate_spec
from services.generation.scheduling import InstanceSpec, Job, StepCost, run_instance


def _spec() -> InstanceSpec:
    cost = StepCost(k1=1e-9, k2=2e-3, k3=5e-5, k4=1e-3, k5=1e-8, prefill_per_token=1e-4, per_sequence=2e-4,
                    kv_bytes_per_token=2048.0)
    return InstanceSpec(cost=cost, kv_capacity_tokens=50_000, max_batch=8)


def _jobs(n: int, seed: int) -> tuple[Job, ...]:
    return tuple(Job(f"j{seed}-{i}", 8 + (i * 7 + seed) % 30, 5 + (i * 37 + seed * 11) % 180, None) for i in range(n))


def test_recovers_a_uniform_slowdown_exactly_and_generalises_to_other_runs():
    true_cost = _spec().cost
    slow = replace(_spec(), cost=replace(true_cost, **{k: getattr(true_cost, k) * 1.7 for k in
                                                       ("k1", "k2", "k3", "k4", "k5",
                                                        "prefill_per_token", "per_sequence")}))
    calib = [MeasuredInstance(_jobs(20, s), "fcfs", run_instance(list(_jobs(20, s)), slow, "fcfs").makespan_s)
             for s in (1, 2)]
    spec, info = calibrate_spec(_spec(), calib)
    assert info["scale"] == pytest.approx(1.7, rel=1e-9)
    assert info["fit_error"] == pytest.approx(0.0, abs=1e-9) and info["runs"] == 2
    # out of sample: another run (other jobs, LPT admission) is predicted exactly too
    other = list(_jobs(50, 9))
    assert (run_instance(other, spec, "lpt").makespan_s
            == pytest.approx(run_instance(other, slow, "lpt").makespan_s, rel=1e-9))
    # the limits are the profile's
    assert (spec.max_batch, spec.kv_capacity_tokens) == (8, 50_000)


def test_geometric_mean_of_ratios_and_errors():
    base = _spec()
    jobs = _jobs(10, 3)
    sim = run_instance(list(jobs), base, "fcfs").makespan_s
    _, info = calibrate_spec(base, [MeasuredInstance(jobs, "fcfs", 2 * sim), MeasuredInstance(jobs, "fcfs", 8 * sim),
                                    MeasuredInstance((), "fcfs", 1.0)])  # an idle instance is ignored
    assert info["scale"] == pytest.approx(4.0) and info["runs"] == 2
    assert info["fit_error"] == pytest.approx((1.0 + 0.5) / 2)
    with pytest.raises(ValueError, match="at least one measured instance"):
        calibrate_spec(base, [MeasuredInstance((), "fcfs", 1.0)])
