"""The cross-site plan, executed, EMULATED (issue 54 item 5): the allocator's plan against an even
split, each run as an emulated fleet across two sites over the cluster file's link.

The cluster is ``deploy/clusters/cross-site-32xH20-128xH800.yaml`` at full size (StreamRL §7.3: the
SGS on 32 H20 in a cloud, the trainer on up to 128 H800, an 80 Gbps link). The declared model is
Qwen2.5-7B (``deploy/configs/emulated.yaml``'s ``trainer.emulation.model``) and the workload is the
run's own iteration (``flows.emulated_plan.config_workload``: 32 prompts x 8 samples, the emulated
lengths capped at 2048 tokens), so the planner and the emulation see the same lengths. Neither
allocation needs the scaled cluster the issue allows: the planner picks TP4 instances, so the
plan's 32 H20 are 8 emulated SGS instances, and the learner is one emulated process whatever its
GPU count.

Declared before the run of record (2026-11-29):

- **plan**: ``allocator.allocate.plan_specs`` on the cluster, objective ``time`` (what
  ``braid run --cluster`` runs): on a quick look at this commit, 32 H20 (DP8xTP4) generating and
  8 H800 (DP4xTP2xPP1) training, the rest of the H800s returned as surplus;
- **even split** (``even_split``): the plan's GPUs in equal counts on the two sites, the
  generation half rounded down to a multiple of the plan's instance size (the remainder trains):
  StreamRL Fig. 10's even split of the same GPUs, on two fixed-role sites. With the plan above,
  20 H20 (5 TP4 instances) + 20 H800. It is priced by the SAME cost model
  (``allocator.allocate.allocation_specs`` -> ``allocator.planner.evaluate_two_sites``) and run by
  the same overrides (``flows.emulated_plan.emulated_overrides``), reload time included (one
  HBM read plus Qwen2.5-7B's bytes over the 80 Gbps link, 1.52 s, per version);
- **mode**: ``one_step``, the pipeline the planner's iteration time assumes (``iteration_s =
  max(T_gen, T_train)``, allocator/planner.py ``make_plan``);
- **metric**: samples per modelled second over the steady iterations (every one after
  ``fleet_async.SKIP``; ``bench.fleet_async.judge_run``). ``predicted_ratio`` = plan / even of
  the planner's samples/s; ``emulated_ratio`` = plan / even measured in the same round;
  ``emulated_vs_predicted`` = emulated_ratio / predicted_ratio per round, the median and spread
  over ``--rounds`` (>= 3) interleaved rounds (round r: ``generation.seed=r``, order rotated by r);
- **target** (issue 54): ``emulated_vs_predicted`` median within ``TARGET`` (10%) of 1. Beside
  it: each allocation's emulated iteration time against its predicted one, samples/s per cost
  (StreamRL Table 1 costs), and the control plane's measured share (orchestrator busy, CPU ms per
  sample, the run's flag). What the planner predicts here, before any run: generation of
  Qwen2.5-7B on H20 is bound by its long tail (one 2048-token sample alone takes 8.26 s; the plan's
  generation 8.31 s), so the even split is predicted only ~2% slower while it costs 1.5x as much:
  the plan's gain on this cluster is its cost, and this bench checks that the emulated fleet
  agrees with the planner's small throughput ratio and with its absolute times.
- **the link, two models**: the planner takes the weights' 1.52 s over the link as hidden (the
  trainer's 2.75 s plus 1.52 s fit in generation's 8.31 s), while the emulation charges it to every
  instance's reload (``emulated_overrides``' ``reload_s``, docs/emulation.md "The weights on the
  wire"), where an instance waits it out before it admits the next version's work. A quick look
  (1 round, 5 iterations, not a result) put both allocations' iterations 19% above the planner's,
  by about that 1.52 s; one of 20 iterations, 10% and 16% (0.86 s and 1.31 s). So beside each
  absolute error the bench reports ``iteration_error_less_link`` (the emulated iteration less one
  link transfer, against the prediction) and ``link_explains``: the excess lies between none and one
  transfer, within ``LINK_TOLERANCE`` of the prediction either side. Both allocations pay the same
  transfer per version, so the ratio of record is compared as it is;
- **iterations**: 20 (the first ``SKIP`` left out), time scale 0.25. Declared after the quick looks
  above (not results; 2026-11-30, on a machine shared with two other benches, load 10-75):
  one_step's iterations on this fleet alternate between ~2 and ~20 modelled s (the instances drain
  and sync one after another), so with 10 steady iterations one round put the emulated ratio at
  1.21x, with 18 at 1.06x (predicted 1.017x).

Lengths: the config's declared lognormal (median 300, sigma 0.9), or ``--data`` (the MMLU-Pro CoT
trace, which then is the planner's workload too). EMULATED: every time here is a prediction.
Writes ``cross_site`` into ``bench/results/fleet.json`` (other parts kept), ``fleet_cross_site.md``
and ``.png``. Expected duration of the record: 2 allocations x 3 rounds x ~90 s (about 9 minutes; a quick look's
run took 100 s on the loaded machine).

    python bench/fleet_cross_site.py [--rounds 3] [--iterations 20] [--time-scale 0.25] [--data FILE] [--quick]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.fleet import run_config  # noqa: E402
from bench.fleet_async import SKIP, judge_run  # noqa: E402
from bench.report_io import (  # noqa: E402
    RecordParser,
    provenance,
    provenance_line,
    results_dir,
    round_order,
    set_fleet_part,
    spread,
)

CONFIG = ROOT / "deploy/configs/emulated.yaml"
CLUSTER = ROOT / "deploy/clusters/cross-site-32xH20-128xH800.yaml"
RUNS = ROOT / "bench/runs/fleet_cross_site"
TARGET = 0.10
LINK_TOLERANCE = 0.05  # of the predicted iteration
ALLOCATIONS = ("plan", "even")
# Declared: at 0.25 the plan's modelled 8.3 s iteration lasts ~2 s of wall time, so the control
# plane's per-iteration work (64 groups routed, rewards, a weight version through the relays to
# every instance) stays a small share of it; fleet.py's fidelity check runs at the same scale.
TIME_SCALE = 0.25


def even_split(plan: dict) -> tuple[int, int]:
    """The plan's GPUs in equal counts on the two sites: the generation half rounded down to a
    multiple of the plan's instance size (at least one instance), the rest training."""
    total, tp = plan["gen_gpus"] + plan["train_gpus"], plan["emulation"]["gen_tensor_parallel"]
    gen = max(tp, total // 2 // tp * tp)
    return gen, total - gen


def allocations(cfg) -> dict[str, dict]:
    """The planner's plan of ``CLUSTER`` for ``cfg`` and the even split, priced by one cost model."""
    from allocator.allocate import allocation_specs, find_model
    from allocator.cluster import load_cluster
    from flows.emulated_plan import config_workload, plan_for_run

    plan = plan_for_run(cfg, str(CLUSTER))
    x, y = even_split(plan)
    wl = config_workload(cfg)
    even = allocation_specs(load_cluster(CLUSTER), str(CLUSTER), find_model(cfg.trainer.emulation.model), wl, x, y)
    return {"plan": plan, "even": even}


def base_overrides(ns) -> list[str]:
    """The declared workload and run shape (both allocations, the planner's workload included)."""
    return ["trainer.mode=one_step", *([f"generation.emulation.lengths={ns.data}"] if ns.data else [])]


def overrides(alloc: dict, r: int, ns, page_size: int) -> list[str]:
    from flows.emulated_plan import emulated_overrides

    return [*base_overrides(ns), *emulated_overrides(alloc, page_size), f"generation.seed={r}",
            f"generation.emulation.time_scale={ns.time_scale}", f"trainer.iterations={ns.iterations}",
            "eval.prompts=8", f"runs_dir={RUNS}", f"cache_dir={ROOT / '.cache'}"]


def judge(run_dir: Path, alloc: dict, scale: float) -> dict:
    """A run's steady throughput (modelled) against the planner's prediction for its allocation."""
    j = judge_run(run_dir, scale)
    iteration = alloc["batch_size"] / j["samples_per_s"]
    return {**j, **iteration_check(iteration, alloc["iteration_s"], alloc.get("cross_site_weight_transfer_s", 0.0))}


def iteration_check(iteration: float, predicted: float, link: float) -> dict:
    """An emulated iteration against the planner's: the error, the error less one link transfer, and
    whether the excess lies between none and one transfer (``LINK_TOLERANCE`` of ``predicted`` either side)."""
    error, less_link = iteration / predicted - 1.0, (iteration - link) / predicted - 1.0
    return {"iteration_s": iteration, "iteration_error": error, "iteration_error_less_link": less_link,
            "link_explains": error >= -LINK_TOLERANCE and less_link <= LINK_TOLERANCE}


def summarize(allocs: dict[str, dict], runs: dict[str, list[dict]], ns, prov: dict) -> dict:
    plan, even = allocs["plan"], allocs["even"]
    predicted = plan["samples_per_s"] / even["samples_per_s"]
    emulated = [a["samples_per_s"] / b["samples_per_s"] for a, b in zip(runs["plan"], runs["even"], strict=True)]
    vs = [e / predicted for e in emulated]
    med = statistics.median(vs)
    sides = {}
    for name, alloc in allocs.items():
        its = [r["iteration_s"] for r in runs[name]]
        sides[name] = {"gen_gpus": alloc["gen_gpus"], "train_gpus": alloc["train_gpus"],
                       "gen_parallel": alloc["gen_parallel"], "train_parallel": alloc["train_parallel"],
                       "gen_instances": alloc["gen_instances"], "cost": alloc["cost"],
                       "predicted": {k: alloc[k] for k in ("t_gen_s", "t_train_s", "iteration_s", "samples_per_s",
                                                           "samples_per_s_per_cost")},
                       "emulated_iteration_s": spread(its),
                       "emulated_vs_predicted_iteration": spread([r["iteration_error"] for r in runs[name]]),
                       "emulated_less_link_vs_predicted": spread([r["iteration_error_less_link"] for r in runs[name]]),
                       "link_explains": all(r["link_explains"] for r in runs[name]),
                       "runs": runs[name], "allocation": alloc}
    return {"label": "EMULATED", "cluster": str(CLUSTER.relative_to(ROOT)), "model": plan["model"],
            "workload": {"batch_size": plan["batch_size"], "lengths": ns.data or "the config's declared lognormal",
                         "mode": "one_step"},
            "time_scale": ns.time_scale, "iterations": ns.iterations, "skip": SKIP, "rounds": ns.rounds,
            "even_split": "the plan's GPUs in equal counts on the two sites (generation rounded down to the plan's "
                          "instance size)",
            "metric": "samples per modelled second over the steady iterations",
            "predicted_ratio": predicted, "emulated_ratio": {**spread(emulated), "per_round": emulated},
            "emulated_vs_predicted": {**spread(vs), "per_round": vs}, "target": TARGET,
            "passed": abs(med - 1.0) <= TARGET,
            "link_s": plan.get("cross_site_weight_transfer_s"), "link_tolerance": LINK_TOLERANCE,
            "predicted_cost_ratio": plan["samples_per_s_per_cost"] / even["samples_per_s_per_cost"],
            "allocations": sides, "provenance": prov}


def markdown(res: dict) -> str:
    vs, em = res["emulated_vs_predicted"], res["emulated_ratio"]
    lines = ["# EMULATED: the cross-site plan, executed", "",
             f"**emulated / predicted ratio {vs['median']:.3f}** (rounds "
             + ", ".join(f"{x:.3f}" for x in vs["per_round"])
             + f"; target within {res['target']:.0%} of 1: {'met' if res['passed'] else '**missed**'}). Plan vs even "
             f"split, samples/s: predicted {res['predicted_ratio']:.3f}x, emulated {em['median']:.3f}x "
             f"({em['min']:.3f}-{em['max']:.3f}); per cost predicted {res['predicted_cost_ratio']:.2f}x. "
             f"{res['model']} on {res['cluster']}, {res['workload']['batch_size']} samples per iteration "
             f"(one_step), lengths: {res['workload']['lengths']}; time scale {res['time_scale']:g}, "
             f"{res['iterations']} iterations (first {res['skip']} left out). Even split: {res['even_split']}. "
             "EMULATED: every figure is a prediction.", "",
             "| allocation | generation | training | cost | predicted gen / train / iteration s | emulated iteration s "
             "(median, range) | emulated vs predicted | less one link transfer | orchestrator busy (max) | "
             "CPU-ms / sample |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in res["allocations"].items():
        p, it, err = s["predicted"], s["emulated_iteration_s"], s["emulated_vs_predicted_iteration"]
        less = s["emulated_less_link_vs_predicted"]
        busy = max((r["orchestrator_busy_max"] or 0.0) for r in s["runs"])
        cpu = statistics.median([r["cpu_ms_per_sample"] or float("nan") for r in s["runs"]])
        lines.append(f"| {name} | {s['gen_gpus']} H20 ({s['gen_parallel']}) | {s['train_gpus']} H800 "
                     f"({s['train_parallel']}) | {s['cost']:.1f} | {p['t_gen_s']:.2f} / {p['t_train_s']:.2f} / "
                     f"{p['iteration_s']:.2f} | {it['median']:.2f} ({it['min']:.2f}-{it['max']:.2f}) | "
                     f"{err['median']:+.1%} | {less['median']:+.1%} | {busy:.0%} | {cpu:.1f} |")
    lines += ["", f"The weights' {res['link_s']:.2f} s over the link: the planner takes them as hidden behind "
              "generation, the emulation charges them to every instance's reload (docs/emulation.md). The excess over "
              f"the planner lies between none and one transfer (within {res['link_tolerance']:.0%}): "
              + ", ".join(f"{n} {'yes' if s['link_explains'] else 'no'}" for n, s in res["allocations"].items()) + "."]
    return "\n".join([*lines, "", provenance_line(res["provenance"]), ""])


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    names = list(res["allocations"])
    pred = [res["allocations"][n]["predicted"]["iteration_s"] for n in names]
    emu = [res["allocations"][n]["emulated_iteration_s"] for n in names]
    xs = range(len(names))
    a.bar([x - 0.2 for x in xs], pred, 0.4, label="planner", color="#999")
    a.bar([x + 0.2 for x in xs], [e["median"] for e in emu], 0.4, label="emulated (median, range)", color="#3a7",
          yerr=[[e["median"] - e["min"] for e in emu], [e["max"] - e["median"] for e in emu]], capsize=3)
    a.set_xticks(list(xs), names)
    a.set_ylabel("iteration time, modelled s")
    a.legend()
    em = res["emulated_ratio"]
    b.bar(["predicted", "emulated"], [res["predicted_ratio"], em["median"]], color=["#999", "#3a7"],
          yerr=[[0, em["median"] - em["min"]], [0, em["max"] - em["median"]]], capsize=3)
    b.set_ylabel("plan / even split, samples/s")
    fig.suptitle(f"EMULATED: {res['model']} on {Path(res['cluster']).stem}, {res['rounds']} rounds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    from services.common.config import load_config

    ap = RecordParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--time-scale", type=float, default=TIME_SCALE)
    ap.add_argument("--data", default=None, help="mmlu_pro_cot_lengths.jsonl.gz (default: the config's lognormal)")
    ap.add_argument("--quick", action="store_true", help="1 round of 5 iterations, scratch output")
    ap.add_argument("--out", default=None)
    ns = ap.parse_args()
    if ns.quick:
        ns.rounds, ns.iterations = 1, 5
    cfg = load_config(CONFIG, base_overrides(ns))
    allocs = allocations(cfg)
    for name, a in allocs.items():
        print(f"{name}: {a['gen_gpus']} H20 {a['gen_parallel']} + {a['train_gpus']} H800 {a['train_parallel']}: "
              f"predicted {a['iteration_s']:.2f} s, {a['samples_per_s']:.2f} samples/s", flush=True)
    prov = provenance(Path(__file__), {k: getattr(ns, k) for k in ("rounds", "iterations", "time_scale", "data")},
                      CONFIG, engine="emulated", inputs=[CLUSTER, *([Path(ns.data)] if ns.data else [])])
    runs: dict[str, list[dict]] = {n: [] for n in ALLOCATIONS}
    for r in range(ns.rounds):
        for name in round_order(list(ALLOCATIONS), r):
            ov = overrides(allocs[name], r, ns, cfg.generation.page_size)
            d = run_config(CONFIG, RUNS / f"r{r}-{name}", lambda _f, ov=ov: ov)
            runs[name].append(judge(d, allocs[name], ns.time_scale))
            print(f"round {r} {name}: {runs[name][-1]['samples_per_s']:.2f} samples/modelled s, iteration "
                  f"{runs[name][-1]['iteration_s']:.2f} s (predicted {allocs[name]['iteration_s']:.2f})", flush=True)
    res = summarize(allocs, runs, ns, prov)
    out = results_dir(ns.out, ns.quick)
    out.mkdir(parents=True, exist_ok=True)
    set_fleet_part(out / "fleet.json", "cross_site", res)
    (out / "fleet_cross_site.md").write_text(markdown(res))
    plot(res, out / "fleet_cross_site.png")
    print(markdown(res))


if __name__ == "__main__":
    main()
