"""Allocator benchmark (SIMULATED: derived H800/H20 roofline profiles, no GPU measured).

Four numbers (StreamRL §7.2 Fig. 10, §7.3 Fig. 12, and two of our own), all from the same cost
models ``braid allocate`` uses: generation time from the discrete-event simulation of the SGS
policies over the roofline-derived PTL profiles (``allocator/profiles``), training time from the
roofline training model (``allocator.training``, MFU 0.40), on StreamRL-like workloads
(``deploy/workloads/codemath-*.yaml``: 1024 samples, PPO, long-tail responses capped at 5K/10K/20K).

(a) ``planned_vs_even_speedup``: per model at 20K on ``single-site-128xH800``, the iteration
    time of an even split (64 + 64 GPUs, each stage with its best parallel config) over the
    planner's (Algorithm 1). StreamRL Fig. 10: 1.25x.
(b) ``cross_site_cost_efficiency_ratio``: Qwen2.5-7B at 20K, samples/s per cost of the
    two-site plan (SGS on the 32 H20, trainer on H800: ``cross-site-32xH20-128xH800``) over
    the cheapest all-H800 single-site plan that is at least as fast (same throughput, fewer
    cost units wins). StreamRL Fig. 12: 1.23-1.31x. The other regimes are in ``details``.
(c) ``max_gap_to_bruteforce``: the largest (plan / brute-force optimum - 1) of the iteration
    time over a grid of models x regimes x budgets (single site and two sites).
(d) ``planning_time_1024_s``: wall time of planning Qwen2.5-7B at 20K on ``1024-gpus``
    (fresh cost model: every simulation counted; median of 3).

    python bench/allocator.py [--quick]   # --quick: a smaller brute-force grid (< 1 min)
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from allocator.allocate import build_cost_model, find_model  # noqa: E402
from allocator.cluster import ClusterSpec, load_cluster, load_workload  # noqa: E402
from allocator.planner import (  # noqa: E402
    CostModel,
    brute_force_single,
    brute_force_two,
    make_plan,
    plan_single_site,
    plan_two_sites,
)
from bench.report_io import RecordParser, provenance, provenance_line, results_dir  # noqa: E402

MODELS = {"Qwen2.5-7B": "qwen2.5-7b", "Qwen2.5-32B": "qwen2.5-32b", "Qwen2.5-72B": "qwen2.5-72b"}
CLUSTERS = ROOT / "deploy/clusters"
WORKLOADS = ROOT / "deploy/workloads"


def cost_model(cluster: str | ClusterSpec, model: str, regime: str) -> CostModel:
    spec = cluster if isinstance(cluster, ClusterSpec) else load_cluster(CLUSTERS / f"{cluster}.yaml")
    return build_cost_model(spec, spec.name, find_model(model), load_workload(WORKLOADS / f"codemath-{regime}.yaml"))


def single_site(gpus: int, step: str = "node") -> ClusterSpec:
    return ClusterSpec.model_validate({"name": f"single-site-{gpus}xH800", "sites": [
        {"name": "h800", "gpu": "H800", "count": gpus, "roles": ["generation", "training"], "allocation_step": step}]})


def even_split(cm: CostModel, n: int):
    half = n // 2 // cm.gen.unit * cm.gen.unit
    return make_plan(cm, half, n - half, mode="single-site", objective="time", budget=(n, 0))


def planned_vs_even() -> dict:
    out = {}
    for label, name in MODELS.items():
        cm = cost_model("single-site-128xH800", name, "20k")
        plan, even = plan_single_site(cm, 128), even_split(cm, 128)
        out[label] = {"speedup": even.iteration_s / plan.iteration_s, "planned": plan.__dict__, "even": even.__dict__}
    return out


def cross_site(regime: str) -> dict:
    cross = plan_two_sites(cost_model("cross-site-32xH20-128xH800", "qwen2.5-7b", regime), 32, 128)
    base = plan_single_site(cost_model("single-site-128xH800", "qwen2.5-7b", regime), 128, "cost",
                            max_iteration_s=cross.iteration_s)
    return {"ratio": cross.samples_per_s_per_cost / base.samples_per_s_per_cost, "cross": cross.__dict__,
            "all_h800": base.__dict__}


def gaps(quick: bool) -> list[dict]:
    """Node-step grid (models x regimes x budgets, single site, and two sites) plus an
    instance-step grid (GPUs move one instance at a time: many more candidates)."""
    models = ["qwen2.5-7b", "qwen2.5-72b"] if quick else list(MODELS.values())
    regimes = ["20k"] if quick else ["5k", "10k", "20k"]
    budgets = [64] if quick else [32, 64, 128]
    fine = [("qwen2.5-7b", "20k", 24)] if quick else [
        ("qwen2.5-7b", r, n) for r in ("5k", "20k") for n in (24, 48)] + [("qwen2.5-32b", "20k", 48)]
    rows = []
    for model, regime, n in fine:
        rows.append(_gap_single(cost_model(single_site(n, "instance"), model, regime), n,
                                f"{model} {regime} single {n} per-instance"))
    for model in models:
        for regime in regimes:
            for n in budgets:
                rows.append(_gap_single(cost_model(single_site(n), model, regime), n, f"{model} {regime} single {n}"))
            cm = cost_model("cross-site-32xH20-128xH800", model, regime)
            plan = plan_two_sites(cm, 32, 128)
            _, _, best = brute_force_two(cm, 32, 128)
            rows.append({"case": f"{model} {regime} two-site 32xH20+128xH800", "plan_s": plan.iteration_s,
                         "bruteforce_s": best, "gap": plan.iteration_s / best - 1.0})
    return rows


def _gap_single(cm: CostModel, n: int, case: str) -> dict:
    try:
        plan = plan_single_site(cm, n)
    except ValueError as err:  # e.g. 72B cannot fit its trainer in 32 GPUs
        return {"case": case, "skipped": str(err)}
    _, _, best = brute_force_single(cm, n)
    return {"case": case, "plan_s": plan.iteration_s, "bruteforce_s": best, "gap": plan.iteration_s / best - 1.0,
            "plan_gpus": [plan.gen_gpus, plan.train_gpus]}


def planning_time_1024(repeats: int = 3) -> tuple[float, dict]:
    times, plan = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        cm = cost_model("1024-gpus", "qwen2.5-7b", "20k")
        plan = plan_single_site(cm, 1024)
        times.append(time.perf_counter() - t0)
    assert plan is not None
    return statistics.median(times), plan.__dict__


def write_markdown(result: dict, path: Path) -> None:
    d = result["details"]
    lines = [
        "# Allocator benchmark (SIMULATED: derived H800/H20 roofline profiles, not measured on GPUs)", "",
        provenance_line(result["provenance"]), "",
        "| metric | value | target (StreamRL) |", "|---|---|---|",
    ]
    for label, v in result["planned_vs_even_speedup"].items():
        lines.append(f"| planned vs even split, {label} @20K, 128 H800 (iteration-time ratio) | {v:.3f}x "
                     f"| 1.25x (Fig. 10) |")
    lines += [
        f"| cross-site 32 H20 + H800 vs all-H800, 7B @20K (samples/s per cost) "
        f"| {result['cross_site_cost_efficiency_ratio']:.3f}x | 1.23-1.31x (Fig. 12) |",
        f"| max gap to brute force over {len(d['gap_grid'])} grid points "
        f"| {result['max_gap_to_bruteforce'] * 100:.2f}% | <= 5% |",
        f"| planning time, 1024 GPUs (7B @20K) | {result['planning_time_1024_s']:.3f} s | < 1 s |",
        "", "## Plans (128 H800, 20K)", "",
        "| model | split | gen GPUs (config) | train GPUs (config) | T_gen s | T_train s | iteration s |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, v in d["planned_vs_even"].items():
        for kind in ("even", "planned"):
            p = v[kind]
            lines.append(f"| {label} | {kind} | {p['gen_gpus']} ({p['gen_parallel']}) "
                         f"| {p['train_gpus']} ({p['train_parallel']}) | {p['t_gen_s']:.1f} | {p['t_train_s']:.1f} "
                         f"| {p['iteration_s']:.1f} |")
    lines += ["", "## Cross-site vs all-H800 (Qwen2.5-7B, same speed or faster, cheapest)", "",
              "| regime | cross: H20 + H800 GPUs | all-H800: gen + train GPUs | cross cost | all-H800 cost | ratio |",
              "|---|---|---|---|---|---|"]
    for regime, v in d["cross_site"].items():
        c, b = v["cross"], v["all_h800"]
        lines.append(f"| {regime} | {c['gen_gpus']} + {c['train_gpus']} | {b['gen_gpus']} + {b['train_gpus']} "
                     f"| {c['cost']:.1f} | {b['cost']:.1f} | {v['ratio']:.3f}x |")
    lines += ["", "Commands: `python bench/allocator.py [--quick]`. " + result["source"], ""]
    path.write_text("\n".join(lines))


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = result["details"]["planned_vs_even"]
    fig, ax = plt.subplots(figsize=(8, 4))
    labels, x = list(d), range(len(d))
    for k, (kind, off) in enumerate((("even", -0.2), ("planned", 0.2))):
        gen = [d[m][kind]["t_gen_s"] for m in labels]
        train = [d[m][kind]["t_train_s"] for m in labels]
        ax.bar([i + off - 0.09 for i in x], gen, 0.18, color=f"C{2 * k}", label=f"{kind}: generation")
        ax.bar([i + off + 0.09 for i in x], train, 0.18, color=f"C{2 * k + 1}", label=f"{kind}: training")
        for i, m in enumerate(labels):
            p = d[m][kind]
            ax.text(i + off, max(p["t_gen_s"], p["t_train_s"]) * 1.02, f"{p['gen_gpus']}/{p['train_gpus']}",
                    ha="center", fontsize=8)
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("stage time per iteration, s (simulated)")
    ax.set_title("Even split vs planned (128 H800, 20K; labels: gen/train GPUs)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = RecordParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller brute-force grid")
    ap.add_argument("--out", default=None, help="default bench/results (--quick: /tmp/braid-bench-quick)")
    ns = ap.parse_args(argv)
    out = results_dir(ns.out, ns.quick)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    pve = planned_vs_even()
    regimes = ["20k"] if ns.quick else ["5k", "10k", "20k"]
    cross = {r: cross_site(r) for r in regimes}
    grid = gaps(ns.quick)
    t1024, plan1024 = planning_time_1024()
    result = {
        "provenance": provenance(Path(__file__), {"quick": ns.quick, "regimes": regimes}),
        "planned_vs_even_speedup": {k: v["speedup"] for k, v in pve.items()},
        "cross_site_cost_efficiency_ratio": cross["20k"]["ratio"],
        "max_gap_to_bruteforce": max(r["gap"] for r in grid if "gap" in r),
        "planning_time_1024_s": t1024,
        "source": ("SIMULATED: generation from the SGS policy simulation over roofline-DERIVED H800/H20 PTL profiles, "
                   "training from the roofline training model (MFU 0.40); no GPU measured. Timings on a shared, noisy "
                   "2-core host."),
        "details": {"quick": ns.quick, "planned_vs_even": pve, "cross_site": cross, "gap_grid": grid,
                    "plan_1024": plan1024, "bench_seconds": time.perf_counter() - t0},
    }
    (out / "allocator.json").write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(result, out / "allocator.md")
    plot(result, out / "allocator.png")
    print(json.dumps({k: result[k] for k in ("planned_vs_even_speedup", "cross_site_cost_efficiency_ratio",
                                             "max_gap_to_bruteforce", "planning_time_1024_s")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
