"""The hardware-affinity cost model and planner (``allocator.affinity``, ``braid affinity``)."""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest

from allocator.affinity import (
    PoolSpec,
    TaskWorkload,
    best_assignment,
    config_snippet,
    plan_affinity,
    prefill_flops,
    task_time,
)
from allocator.affinity_files import load_affinity_file, plan_file
from allocator.cluster import AllocationInputError
from flows.cli import main as cli_main
from services.common.config import GenerationConfig
from services.generation.scheduling.hardware import HARDWARE
from services.generation.scheduling.models import get_model
from services.generation.scheduling.pools import eligible_instances

ROOT = Path(__file__).resolve().parents[2]
FIG4 = ROOT / "deploy/workloads/affinity/rollart-fig4.yaml"
MODEL = get_model("qwen2.5-7b")
AGENT = TaskWorkload("agent", trajectories=64, turns=10, prompt_tokens=300, observation_tokens=100, output_tokens=50)
H800, H20 = PoolSpec("compute", "H800", 2), PoolSpec("bandwidth", "H20", 6)


def total(task: TaskWorkload, pool: PoolSpec = H20, **kw) -> float:
    return task_time(task, pool, MODEL, **kw).total_s


@pytest.mark.parametrize("field, low, high", [
    ("turns", 5, 20), ("output_tokens", 20, 400), ("observation_tokens", 0, 400), ("prompt_tokens", 100, 2000),
    ("trajectories", 16, 512),
])
@pytest.mark.parametrize("pool", [H800, H20], ids=["H800", "H20"])
def test_more_work_never_takes_less_time(field, low, high, pool):
    assert total(replace(AGENT, **{field: low}), pool) < total(replace(AGENT, **{field: high}), pool)


@pytest.mark.parametrize("kind", ["H800", "H20"])
def test_more_gpus_never_take_longer(kind):
    times = [total(AGENT, PoolSpec("p", kind, g)) for g in (1, 2, 3, 4, 8, 16, 64, 128)]
    assert all(a >= b for a, b in itertools.pairwise(times)) and times[0] > times[-1]


def test_prefix_caching_saves_prefill_and_only_prefill():
    cached, full = task_time(AGENT, H20, MODEL), task_time(replace(AGENT, prefix_cache=False), H20, MODEL)
    assert full.prefill_s > 3 * cached.prefill_s and math.isclose(full.decode_s, cached.decode_s)
    one_turn = replace(AGENT, turns=1)
    assert math.isclose(total(one_turn), total(replace(one_turn, prefix_cache=False)))


def test_prefill_is_compute_bound_and_decode_bandwidth_bound():
    assert prefill_flops(MODEL, 100, 0) < prefill_flops(MODEL, 100, 5000) < prefill_flops(MODEL, 200, 5000)
    assert math.isclose(prefill_flops(MODEL, 1, 0), MODEL.decode_flops_per_token(), rel_tol=1e-3)
    h800, h20 = task_time(AGENT, PoolSpec("a", "H800", 1), MODEL), task_time(AGENT, PoolSpec("b", "H20", 1), MODEL)
    # prefill scales with peak FLOPs (6.7x); decode with bandwidth, where the H20 (4 TB/s) beats the H800 (3.35)
    ratio = HARDWARE["H800"].bf16_tflops / HARDWARE["H20"].bf16_tflops
    assert h20.prefill_s / h800.prefill_s == pytest.approx(ratio, rel=0.05)
    assert task_time(replace(AGENT, trajectories=4), PoolSpec("b", "H20", 1), MODEL).decode_s < \
        task_time(replace(AGENT, trajectories=4), PoolSpec("a", "H800", 1), MODEL).decode_s
    one = PoolSpec("a", "H20", 1)
    assert total(AGENT, one, prefill_mfu=0.3) > total(AGENT, one, prefill_mfu=0.7)


@pytest.mark.parametrize("mfu", [0.3, 0.5, 0.7])
def test_rollart_fig4_direction_at_cost_equivalent_counts(mfu):
    """RollArt §3.1, Fig. 4: 2 H800 beat 6 H20 on the prefill-heavy task (down to 0.53x), the 6 H20
    beat the 2 H800 on the decode-heavy one (0.49-0.79x). The roofline must agree, whatever the MFU."""
    spec = load_affinity_file(FIG4)
    pools = {p.name: p for p in spec.pools}
    cost = {name: HARDWARE[p.gpu].cost * p.gpus for name, p in pools.items()}
    assert pools["compute"].gpu == "H800" and pools["bandwidth"].gpu == "H20"
    assert cost["compute"] == pytest.approx(cost["bandwidth"], rel=0.06)  # 5.7 vs 6.0: cost-equivalent
    plan = plan_file(FIG4, prefill_mfu=mfu)
    t = {(r["task"], r["pool"]): r for r in plan["times"]}
    assert t["frozenlake", "compute"]["total_s"] < t["frozenlake", "bandwidth"]["total_s"]
    assert t["gem-math", "bandwidth"]["total_s"] < 0.8 * t["gem-math", "compute"]["total_s"]
    assert t["frozenlake", "bandwidth"]["prefill_share"] > 0.5 > t["gem-math", "bandwidth"]["prefill_share"]
    assert plan["mapping"] == {"frozenlake": "compute", "gem-math": "bandwidth"}


def _exhaustive(times: list[list[float]]) -> tuple[float, float]:
    n_pools = len(times[0])
    return min(
        (max(sum(row[p] for row, c in zip(times, choice, strict=True) if c == p) for p in range(n_pools)),
         sum(row[c] for row, c in zip(times, choice, strict=True)))
        for choice in itertools.product(range(n_pools), repeat=len(times))
    )


def test_planner_matches_exhaustive_search_on_random_small_cases():
    rng = random.Random(11)
    for trial in range(150):
        n_tasks, n_pools = rng.randint(1, 6), rng.randint(1, 4)
        times = [[rng.choice([rng.uniform(0.5, 20.0), float(rng.randint(1, 4))]) for _ in range(n_pools)]
                 for _ in range(n_tasks)]
        if trial % 3 == 0:  # twin pools: priced alike
            for row in times:
                row[-1] = row[0]
        assignment, makespan, busy = best_assignment(times)
        want = _exhaustive(times)
        assert makespan == pytest.approx(want[0], rel=1e-9) and busy <= want[1] * (1 + 1e-9), (times, assignment)
        loads = [sum(row[p] for row, a in zip(times, assignment, strict=True) if a == p) for p in range(n_pools)]
        assert max(loads) == pytest.approx(makespan)
    assert best_assignment([]) == ((), 0.0, 0.0)


def test_planner_refuses_bad_inputs():
    with pytest.raises(ValueError, match="unknown GPU kind 'A100'"):
        PoolSpec("x", "A100", 2)
    with pytest.raises(ValueError, match=r"hold no instance of qwen2.5-72b"):
        plan_affinity([AGENT], [PoolSpec("small", "H800", 2)], "qwen2.5-72b")
    with pytest.raises(ValueError, match="task names must be unique"):
        plan_affinity([AGENT, AGENT], [H800], MODEL)
    with pytest.raises(ValueError, match="at most 12 tasks"):
        plan_affinity([replace(AGENT, name=f"t{i}") for i in range(13)], [H800], MODEL)
    with pytest.raises(ValueError, match="turns must be >= 1"):
        replace(AGENT, turns=0)


def test_config_snippet_is_a_valid_generation_config_that_routes_as_planned():
    tasks = [replace(AGENT, name="swe", turns=30), replace(AGENT, name="math", turns=2, output_tokens=3000)]
    plan = plan_affinity(tasks, [H800, H20], MODEL)
    gen = GenerationConfig.model_validate(config_snippet(plan)["generation"])
    assert gen.instances == 8 and plan.mapping == {"swe": "compute", "math": "bandwidth"}
    assert eligible_instances("swe", gen, range(8)) == [0, 1]
    assert eligible_instances("math", gen, range(8)) == [2, 3, 4, 5, 6, 7]


def test_cli_prints_the_mapping_and_the_config(capsys, tmp_path):
    assert cli_main(["affinity", "--tasks", str(FIG4), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["config"]["generation"]["affinity"] == plan["mapping"] and "not measured" in plan["source"]
    assert cli_main(["affinity", "--tasks", str(FIG4)]) == 0
    out = capsys.readouterr().out
    assert "frozenlake -> compute" in out and "- {name: bandwidth, hardware: H20, instances: [2, 3, 4, 5, 6, 7]}" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(FIG4.read_text().replace("gpu: H20", "gpu: H30"))
    assert cli_main(["affinity", "--tasks", str(bad)]) == 2
    assert "unknown GPU kinds ['H30']" in capsys.readouterr().err
    bad.write_text(FIG4.read_text().replace("name: gem-math", "name: gem math"))
    assert cli_main(["affinity", "--tasks", str(bad)]) == 2
    assert "tasks.1.name" in capsys.readouterr().err
    with pytest.raises(AllocationInputError, match="no such task-mix file"):
        plan_file(tmp_path / "missing.yaml")


@pytest.mark.parametrize("text, problems", [
    ("pools: [{name: a, gpu: H800, gpus: 1}]\n",
     ["name: Field required", "model: Field required", "tasks: Field required"]),
    (None, ["<root>: unknown GPU kinds ['H30']; known: ['H100', 'H20', 'H800']"]),
    ("name: x\nmodel: qwen2.5-7b\npools: [{name: a, gpu: H800, gpus: 1}]\n"
     "tasks:\n  - {name: t, trajectories: 1, turns: 1}\n"
     "  - {name: u, trajectories: 1, turns: 1}\n",
     [f"tasks.{i}.{f}: Field required"
      for i in (0, 1) for f in ("prompt_tokens", "observation_tokens", "output_tokens")]),
], ids=["missing-top-level-fields", "file-validator", "missing-task-fields"])
def test_a_bad_task_mix_file_is_named_once_with_each_problem_once(capsys, tmp_path, text, problems):
    bad = tmp_path / "mix.yaml"
    bad.write_text(FIG4.read_text().replace("gpu: H20", "gpu: H30") if text is None else text)
    assert cli_main(["affinity", "--tasks", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"braid affinity: invalid task-mix file ({bad}):", *(f"  {p}" for p in problems)]
