"""bench/dispatch_train_sim.py's pure parts and the simulator's shared-core makespan."""

from __future__ import annotations

import json

import pytest

from allocator.simulator import SimSample, shared_makespan, simulate
from bench.dispatch_train_sim import judge, step_groups, step_spans, variant_policy
from services.generation.scheduling.cost import InstanceSpec, StepCost


def test_processor_sharing_ends_when_the_shared_cores_have_done_all_the_work():
    assert shared_makespan([3.0, 5.0], 1) == pytest.approx(8.0)  # one core: the sum
    assert shared_makespan([3.0, 5.0], 2) == pytest.approx(5.0)  # a core each: the longest
    assert shared_makespan([2.0, 2.0, 2.0], 2) == pytest.approx(3.0)  # 6 s of work on 2 cores
    assert shared_makespan([1.0, 1.0, 4.0], 2) == pytest.approx(4.5)  # 3 share 2 cores until 1.5 s, then one alone
    assert shared_makespan([], 1) == 0.0
    with pytest.raises(ValueError, match="cores"):
        shared_makespan([1.0], 0)


def test_on_one_core_an_even_split_no_longer_beats_an_uneven_one_by_the_longest_instance():
    spec = InstanceSpec(cost=StepCost(k1=0.0, k2=0.01, k3=0.0, k4=0.0, kv_bytes_per_token=1.0),
                        kv_capacity_tokens=100_000, max_batch=64)
    samples = [SimSample(f"s{i}", 4, n) for i, n in enumerate([100, 100, 10, 10])]
    own = simulate(samples, spec, 2, policy="round_robin", admission="fcfs")
    shared = simulate(samples, spec, 2, policy="round_robin", admission="fcfs", cores=1)
    works = own.instance_makespans
    assert own.makespan_s == pytest.approx(max(works)) and shared.makespan_s == pytest.approx(sum(works))


def test_judge_calibrates_on_one_variant_and_judges_the_others():
    measured = {"round_robin": [2.0, 2.2, 2.1], "lpt": [1.0, 1.1, 1.05], "least_loaded": [2.0, 2.1, 2.6]}
    simulated = {"round_robin": [1.0, 1.0, 1.05], "lpt": [0.7, 0.7, 0.7], "least_loaded": [1.0, 1.0, 1.0]}
    out = judge(measured, simulated, "round_robin")
    assert out["scale"] == pytest.approx(2.1 / 1.0)
    assert out["calibration_error"] == pytest.approx(0.0)
    assert out["error"]["lpt"] == pytest.approx(0.7 * 2.1 / 1.05 - 1)  # 0.4
    assert out["sim_error_max_per_policy"] == pytest.approx(0.4) and out["worst_variant"] == "lpt"
    assert out["order_measured"] == ["lpt", "round_robin", "least_loaded"]
    # round_robin and least_loaded simulate equal: sorted() keeps the measured listing's order
    assert out["sim_policy_order_matches"] is False or out["order_simulated"] == out["order_measured"]
    # lpt's rounds lie below both others': two resolved pairs, both ordered the same by the simulator
    assert sorted(map(tuple, out["resolved_pairs"])) == [("least_loaded", "lpt"), ("lpt", "round_robin")]
    assert out["sim_resolved_pairs_agree"] == 1.0
    with pytest.raises(ValueError, match="calibration variant"):
        judge(measured, simulated, "streamrl")


def test_a_simulated_order_against_the_measured_one_is_not_a_match():
    measured = {"a": [1.0, 1.0, 1.0], "b": [2.0, 2.0, 2.0]}
    out = judge(measured, {"a": [2.0] * 3, "b": [1.0] * 3}, "a")
    assert out["sim_policy_order_matches"] is False and out["sim_resolved_pairs_agree"] == 0.0


def test_a_runs_steps_and_spans_come_from_its_ledger_and_metrics(tmp_path):
    events = [{"event": "start"}] + [{"event": "consume", "step": s, "prompt_id": f"p{s}{k}"}
                                     for s in (2, 1) for k in range(2)]
    (tmp_path / "ledger.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    rows = [{"gen_first_start": 10.0, "gen_last_finish": 12.5}, {"gen_first_start": 20.0, "gen_last_finish": 21.0}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert step_groups(tmp_path) == [["p10", "p11"], ["p20", "p21"]]
    assert step_spans(tmp_path) == [2.5, 1.0]
    cfg = {"generation": {"dispatch": {"policy": "lpt"}, "admission": "lpt"}}
    assert (variant_policy("pick", cfg) == ("least_loaded", "lpt")
            and variant_policy("lpt+ranker", cfg) == ("lpt", "lpt"))


def _run_dir(tmp_path, variant_overrides: list[str]):
    """A run directory as bench/dispatch_train.py leaves one: config, ledger of 3 steps x 8 groups."""
    from services.common.config import load_config, write_config

    tmp_path.mkdir()
    lengths = tmp_path / "lengths.json"
    lengths.write_text(json.dumps([{"length": n, "estimate": n * 0.8} for n in (8, 12, 20, 40, 90, 200)]))
    cfg = load_config(None, ["generation.instances=2", "generation.max_inflight=16", "trainer.group_size=8",
                             "generation.max_new_tokens=256", "generation.forced_lengths=true",
                             f"forced_length_replay.file={lengths}", *variant_overrides])
    run = tmp_path / "run"
    run.mkdir()
    write_config(cfg, run / "config.json")
    events = [{"event": "consume", "step": s, "prompt_id": f"p{s}-{k}"} for s in range(3) for k in range(8)]
    (run / "ledger.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    return run


def test_both_models_replay_a_runs_steps(tmp_path):
    """The launch path (groups start as others finish, 2 per instance here) and the whole step at
    once both give one span per step; with room for only 2 groups per instance the launch path
    leaves a length-blind dispatch policy nothing to choose, so it simulates the pick's spans."""
    from bench.dispatch_train_sim import PROFILE, simulate_run, simulate_run_launched
    from services.generation.scheduling.profiles import load_profile

    profile = load_profile(PROFILE)
    pick = _run_dir(tmp_path / "pick", [])
    rr = _run_dir(tmp_path / "rr", ["generation.dispatch.policy=round_robin"])
    oracle = _run_dir(tmp_path / "oracle", ["generation.dispatch.policy=lpt", "forced_length_replay.estimates=oracle"])
    launched = {name: simulate_run_launched(d, name, profile) for name, d in
                (("pick", pick), ("round_robin", rr), ("lpt+oracle", oracle))}
    assert all(len(v) == 3 and min(v) > 0 for v in launched.values())
    assert launched["pick"] == pytest.approx(launched["round_robin"])
    assert len(simulate_run(oracle, "lpt+oracle", profile)) == 3
