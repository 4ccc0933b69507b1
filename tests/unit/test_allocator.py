"""Allocator: planner (StreamRL Algorithm 1) on hand-made cost curves with known answers, the
real cost models against brute force on a small grid, the memory model, input errors, the CLI."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from allocator.allocate import PLAN_FIELDS, build_cost_model, find_model, plan_files
from allocator.cluster import (
    AllocationInputError,
    ClusterSpec,
    WorkloadSpec,
    load_cluster,
    load_workload,
    machine_cores,
)
from allocator.memory import ParallelConfig, training_memory
from allocator.planner import (
    CostModel,
    GenPool,
    GenWorkload,
    TrainPool,
    brute_force_single,
    brute_force_two,
    evaluate_two_sites,
    plan_single_site,
    plan_two_sites,
)
from allocator.training import TrainSite, TrainWorkload, search
from flows.cli import main as cli_main
from services.generation.scheduling.hardware import get_hardware
from services.generation.scheduling.models import get_model

ROOT = Path(__file__).resolve().parents[2]


class TableCost(CostModel):
    """A cost model with hand-made T_gen(x) and T_train(y) (fakes for the pure planner)."""

    def __init__(self, gen, train, *, cost_gen=1.0, cost_train=1.0, batch=60):
        hw = get_hardware("H800")
        spec = None
        super().__init__(
            model=get_model("braid-tiny"),
            gen=GenPool("G", 0, cost_gen, {1: spec}, 1),  # type: ignore[dict-item]
            train=TrainPool("T", 0, 1, cost_train, TrainSite(hw, 8, 25.0)),
            gen_wl=GenWorkload(tuple([1] * batch), tuple([1] * batch)),
            train_wl=TrainWorkload(tokens=1, attn_sq=1.0, mb_tokens=1),
        )
        self._g, self._t = gen, train

    def gen_choice(self, x):
        self.gen_evals += 1
        return self._g(x), 1

    def gen_floor(self):
        return 0.0

    def t_train(self, y):
        return self._t(y)

    def train_parallel(self, y):
        return f"DP{y}xTP1xPP1"


def test_single_site_balances_the_two_stages():
    cm = TableCost(lambda x: 100.0 / x, lambda y: 60.0 / y)
    plan = plan_single_site(cm, 8)
    assert (plan.gen_gpus, plan.train_gpus) == (5, 3)  # 100/5 = 60/3 = 20
    assert plan.iteration_s == pytest.approx(20.0) and plan.samples_per_s == pytest.approx(3.0)
    assert brute_force_single(cm, 8) == (5, 3, pytest.approx(20.0))


def test_single_site_returns_the_surplus_when_one_stage_has_a_floor():
    cm = TableCost(lambda x: max(30.0, 100.0 / x), lambda y: 40.0 / y)  # generation cannot beat 30 s
    plan = plan_single_site(cm, 16)
    assert plan.iteration_s == pytest.approx(30.0)
    assert plan.gen_gpus == 4 and plan.train_gpus == 2  # fewest GPUs reaching 30 s: 100/4 = 25 <= 30, 40/2 = 20
    assert plan.surplus_gen_gpus == 10


def test_two_sites_shrink_the_faster_stage():
    cm = TableCost(lambda x: 100.0 / x, lambda y: 60.0 / y)
    plan = plan_two_sites(cm, 8, 8)  # full: gen 12.5 s, train 7.5 s -> shrink training
    assert (plan.gen_gpus, plan.train_gpus) == (8, 5)  # 60/5 = 12 <= 12.5, 60/4 = 15 > 12.5
    assert plan.surplus_train_gpus == 3 and plan.iteration_s == pytest.approx(12.5)
    plan = plan_two_sites(TableCost(lambda x: 20.0 / x, lambda y: 60.0 / y), 8, 8)  # generation faster
    assert (plan.gen_gpus, plan.train_gpus) == (3, 8)  # 20/3 = 6.7 <= 7.5
    assert brute_force_two(cm, 8, 8)[2] == pytest.approx(12.5)


def test_a_given_two_site_allocation_is_priced_by_the_plans_cost_model():
    import dataclasses

    cm = TableCost(lambda x: 100.0 / x, lambda y: 60.0 / y if y >= 2 else math.inf)
    cm.gen, cm.train = dataclasses.replace(cm.gen, gpus=8), dataclasses.replace(cm.train, gpus=8)
    plan = plan_two_sites(cm, 8, 8)
    same = evaluate_two_sites(cm, plan.gen_gpus, plan.train_gpus)
    assert (same.iteration_s, same.samples_per_s, same.cost) == (plan.iteration_s, plan.samples_per_s, plan.cost)
    even = evaluate_two_sites(cm, 4, 4)  # generation 25 s, training 15 s: one-step, the slower stage sets it
    assert even.iteration_s == pytest.approx(25.0) and even.samples_per_s == pytest.approx(60 / 25.0)
    assert (even.surplus_gen_gpus, even.surplus_train_gpus) == (4, 4)
    for x, y, why in ((9, 4, "outside the sites' budgets"), (4, 0, "outside"), (4, 1, "no training allocation")):
        with pytest.raises(ValueError, match=why):
            evaluate_two_sites(cm, x, y)


def test_cost_objective_prefers_the_cheaper_kind_for_the_same_speed():
    cm = TableCost(lambda x: 100.0 / x, lambda y: 60.0 / y, cost_gen=1.0, cost_train=2.85)
    plan = plan_two_sites(cm, 8, 8, objective="cost")
    assert plan.samples_per_s_per_cost == pytest.approx(plan.samples_per_s / (plan.gen_gpus + 2.85 * plan.train_gpus))
    every = [60 / max(100 / x, 60 / y) / (x + 2.85 * y) for x in range(1, 9) for y in range(1, 9)]
    assert plan.samples_per_s_per_cost == pytest.approx(max(every), rel=1e-6)
    capped = plan_two_sites(cm, 8, 8, objective="cost", max_iteration_s=13.0)
    assert capped.iteration_s <= 13.0
    with pytest.raises(ValueError, match="no allocation reaches"):
        plan_two_sites(cm, 8, 8, objective="cost", max_iteration_s=1.0)


def _small_problem(model: str, gpus: int, step: str = "node") -> CostModel:
    cluster = ClusterSpec.model_validate({"name": "t", "sites": [
        {"name": "s", "gpu": "H800", "count": gpus, "roles": ["generation", "training"], "allocation_step": step}]})
    wl = WorkloadSpec.model_validate({"name": "w", "batch_size": 64, "algorithm": "grpo",
                                      "prompt_tokens": {"samples": [200, 400]},
                                      "response_tokens": {"lognormal": {"median": 800, "sigma": 1.0, "max": 8000}}})
    return build_cost_model(cluster, "t.yaml", get_model(model), wl)


@pytest.mark.parametrize("gpus,step", [(32, "node"), (24, "instance")])
def test_planner_is_within_5_percent_of_brute_force_on_real_cost_models(gpus, step):
    cm = _small_problem("qwen2.5-7b", gpus, step)
    plan = plan_single_site(cm, gpus)
    _, _, best = brute_force_single(cm, gpus)
    assert plan.iteration_s <= 1.05 * best
    assert plan.gen_gpus + plan.train_gpus <= gpus and plan.gen_gpus % cm.gen.unit == 0
    assert plan.iteration_s == pytest.approx(max(plan.t_gen_s, plan.t_train_s))


def test_memory_model_rejects_what_does_not_fit_and_says_by_how_much():
    hw, model = get_hardware("H800"), get_model("qwen2.5-72b")
    mem = training_memory(model, ParallelConfig(dp=1, tp=1, pp=1), hbm_gb=hw.hbm_gb, mb_tokens=8192)
    assert not mem.fits and mem.needed > 1e12 and mem.available == pytest.approx(72e9)
    wl = TrainWorkload(tokens=1_000_000, attn_sq=1e9, mb_tokens=8192)
    site = TrainSite(hw, 8, 25.0)
    assert search(model, 8, site, wl).best is None
    assert "GB per GPU" in search(model, 8, site, wl).why_not(model.name, "H800")
    fits = search(model, 64, site, wl).best
    assert fits is not None and fits.memory.fits and fits.cfg.tp <= 8
    small = search(get_model("qwen2.5-7b"), 8, site, wl).best
    assert small is not None and small.memory.needed <= small.memory.available


def test_more_training_gpus_are_faster():
    wl = TrainWorkload(tokens=4_000_000, attn_sq=4e10, mb_tokens=20_000, algorithm="ppo")
    site, model = TrainSite(get_hardware("H800"), 8, 25.0), get_model("qwen2.5-7b")
    times = [search(model, y, site, wl).best.total_s for y in (16, 32, 64)]  # type: ignore[union-attr]
    assert times[0] > times[1] > times[2]


def _write(tmp: Path, name: str, text: str) -> str:
    (tmp / name).write_text(text)
    return str(tmp / name)


CLUSTER = "name: c\nsites:\n  - {name: a, gpu: GPU, count: COUNT, roles: [generation, training]}\n"
TINY = str(ROOT / "deploy/workloads/tiny.yaml")
W20K = str(ROOT / "deploy/workloads/codemath-20k.yaml")


@pytest.mark.parametrize("gpu,count,model,workload,expect", [
    ("H800", "-8", "qwen2.5-7b", TINY, "sites.0.count: Input should be greater than or equal to 1"),
    ("V100", "8", "qwen2.5-7b", TINY, "unknown GPU kind 'V100'"),
    ("H20", "8", "qwen2.5-72b", W20K, "GB available"),
    ("H800", "8", "gpt-5", TINY, "unknown model 'gpt-5'"),
])
def test_bad_cluster_inputs_say_what_is_missing(tmp_path, gpu, count, model, workload, expect):
    path = _write(tmp_path, "c.yaml", CLUSTER.replace("GPU", gpu).replace("COUNT", count))
    with pytest.raises(AllocationInputError, match=expect) as err:
        plan_files(path, model, workload)
    if "GB" in expect:
        assert "needs" in str(err.value) and "per GPU" in str(err.value)


def test_empty_workload_and_missing_file_are_refused(tmp_path):
    path = _write(tmp_path, "w.yaml", "name: e\nbatch_size: 4\nprompt_tokens: {samples: []}\n"
                  "response_tokens: {samples: [3]}\n")
    with pytest.raises(AllocationInputError, match=r"(?s)w.yaml.*prompt_tokens.samples"):
        load_workload(path)
    with pytest.raises(AllocationInputError, match="no such cluster file"):
        load_cluster(tmp_path / "none.yaml")
    with pytest.raises(AllocationInputError, match="batch_size"):
        load_workload(_write(tmp_path, "z.yaml", "name: z\nbatch_size: 0\nprompt_tokens: {samples: [1]}\n"
                             "response_tokens: {samples: [1]}\n"))


def test_every_shipped_cluster_and_workload_file_loads():
    clusters = sorted((ROOT / "deploy/clusters").glob("*.yaml"))
    workloads = sorted((ROOT / "deploy/workloads").glob("*.yaml"))
    assert {p.name for p in clusters} >= {"single-site-128xH800.yaml", "cross-site-32xH20-128xH800.yaml",
                                          "1024-gpus.yaml"}
    for p in clusters:
        load_cluster(p)
    for p in workloads:
        assert load_workload(p).batch_size >= 1
    assert find_model("Qwen2.5-7B").name == "qwen2.5-7b"


def test_cli_json_has_the_plan_fields(capsys):
    rc = cli_main(["allocate", "--cluster", str(ROOT / "deploy/clusters/local-cpu.yaml"), "--model", "braid-tiny",
                   "--workload", TINY, "--json"])
    assert rc == 0
    plan = json.loads(capsys.readouterr().out)
    assert set(PLAN_FIELDS) <= set(plan)
    assert (plan["gen_gpus"] + plan["train_gpus"] <= machine_cores()
            and math.isclose(plan["iteration_s"], max(plan["t_gen_s"], plan["t_train_s"])))


def test_cli_bad_input_exits_2_with_the_message(tmp_path, capsys):
    path = _write(tmp_path, "c.yaml", CLUSTER.replace("GPU", "V100").replace("COUNT", "8"))
    assert cli_main(["allocate", "--cluster", path, "--model", "qwen2.5-7b", "--workload", TINY]) == 2
    assert "unknown GPU kind 'V100'" in capsys.readouterr().err


def test_rl_training_takes_a_plan_for_the_local_cluster(tmp_path):
    from flows.rl_training import load_plan, plan_overrides
    from services.common.config import ConfigError

    plan = plan_files(ROOT / "deploy/clusters/local-cpu.yaml", "braid-tiny", TINY)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    assert load_plan(str(tmp_path / "plan.json")) == plan
    from services.common.config import load_config

    real = load_config(ROOT / "deploy/configs/default.yaml")
    assert plan_overrides(plan, real) == [f"generation.instances={plan['gen_instances']}"]
    assert plan_overrides({**plan, "model": "qwen2.5-7b"}, real) == []  # a GPU plan is only recorded
    with pytest.raises(ConfigError, match="missing fields"):
        load_plan({"model": "braid-tiny"})


def test_the_local_cluster_has_the_cores_this_process_may_run_on():
    """local-cpu.yaml says count: auto: a plan never puts more instances on the machine than it has cores."""
    site = load_cluster(ROOT / "deploy/clusters/local-cpu.yaml").sites[0]
    assert site.count == site.gpus_per_node == machine_cores() == len(os.sched_getaffinity(0))
    one_core = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
                "from allocator.cluster import load_cluster; "
                "print(load_cluster('deploy/clusters/local-cpu.yaml').sites[0].count)")
    out = subprocess.run([sys.executable, "-c", one_core], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "1"


def test_auto_is_the_only_word_a_count_takes(tmp_path):
    path = _write(tmp_path, "c.yaml", CLUSTER.replace("GPU", "H800").replace("COUNT", "many"))
    with pytest.raises(AllocationInputError, match=r"sites\.0\.count: Input should be a valid integer"):
        load_cluster(path)
