"""The report of ``bench/fleet_dispatch.py`` (EMULATED dispatch at fleet scale): its markdown page
and its plot, from the result it writes to ``fleet.json`` ``dispatch``."""

from __future__ import annotations

from pathlib import Path

from bench.report_io import provenance_line


def markdown(res: dict) -> str:
    """``fleet_dispatch.md``: the verdicts, the traces, and each block's table of variants."""
    s = res["settings"]
    lines = ["# EMULATED: skewness-aware dispatch at fleet scale (bench/fleet_dispatch.py)", "",
             f"EMULATED ({s['instances']} instances of H20 serving Qwen2.5-7B, time scale {s['time_scale']:g}, "
             f"max_inflight {s['max_inflight']}, {s['prompts']} groups of 8 per step, {s['iterations']} iterations, "
             f"{s['rounds']} interleaved rounds): every time is a prediction in modelled seconds. Metric of record: "
             "a step's generation makespan (mean of the steady steps); ratio = best length-blind / variant "
             "(>1 = faster).", ""]
    for key, v in res["verdicts"].items():
        val = v["value"]
        shown = (f"{val:.3f}" if isinstance(val, float) else str(val)) if val is not None else (
            "no pair judged (the simulator ties every pair the rounds resolve: `sim_tied_pairs`)"
            if key == "sim_policy_order_matches" and res.get("sim_blocks") else "not measured")
        met = {None: "n/a", True: "met", False: "**missed**"}[v["met"]]
        lines.append(f"- `{key}`: {shown} (target {v['target']}: {met})")
    orc = res.get("oracle_vs_best_length_blind")
    if orc is not None:
        lines.append(f"- `oracle_vs_best_length_blind` ({orc['variant']}): {orc['median']:.3f} "
                     f"[{orc['min']:.3f}-{orc['max']:.3f}]")
    best = res.get("best_ranker_vs_best_length_blind")
    if best is not None:
        lines.append(f"- best ranker variant ({best['variant']}): {best['median']:.3f} "
                     f"[{best['min']:.3f}-{best['max']:.3f}]")
    for name, t in res["traces"].items():
        lines.append(f"- trace `{name}` ({t['model']}): p50 {t['lengths']['p50']:.0f} / p99 {t['lengths']['p99']:.0f}"
                     f" tokens, {t['lengths']['at_cap']:.1%} at the cap; the ranker's Spearman "
                     f"{t['ranker_spearman']:.2f}, recall@20% {t['ranker_recall_at_20']:.2f}")
    for name, b in res["blocks"].items():
        sim = b.get("sim")
        lines += ["", f"## {name} (EMULATED)", "",
                  "| variant | makespan s | vs best blind | trained tokens/s | vs best blind | simulated s | sim error "
                  "| policy wall s / step | orchestrator busy (max) | CPU-ms / sample | cores busy |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for v, x in b["variants"].items():
            g, r, t, rt = x["gen_span_s"], x["vs_best_length_blind"], x["tokens_per_s"], \
                x["tokens_per_s_vs_best_length_blind"]
            simcol = (f"{sim['simulated_gen_span_s'][v]['median']:.2f} | {sim['sim_error'][v]:.1%}" if sim
                      else "- | -")
            flag = " (spread >= effect)" if r["spread_as_large_as_effect"] else ""
            lines.append(f"| {v} | {g['median']:.2f} [{g['min']:.2f}-{g['max']:.2f}] | {r['median']:.3f} "
                         f"[{r['min']:.3f}-{r['max']:.3f}]{flag} | {t['median']:.0f} | {rt['median']:.3f} | {simcol} "
                         f"| {x['dispatch_plan_s']['median']:.3f} | {x['orchestrator_busy_max']:.0%} "
                         f"| {x['cpu_ms_per_sample']['median']:.1f} "
                         f"| {x['cores_busy']['median']:.2f} |")
        lines += ["", f"Best length-blind: `{b['best_length_blind']}` (by tokens/s: "
                      f"`{b['best_length_blind_tokens_per_s']}`)."]
        if sim:
            judged = sim["judged_pairs"]
            lines.append(f"Simulator: order {' < '.join(sim['order_simulated'])}; emulated "
                         f"{' < '.join(sim['order_emulated'])}; of {len(judged)} pairs the rounds resolve and the "
                         f"simulator orders, {sum(p['agrees'] for p in judged)} agree; {len(sim['sim_tied_pairs'])} "
                         f"resolved pairs the simulator ties; largest error {sim['sim_error_max_per_policy']:.1%} "
                         f"({sim['worst']}).")
    return "\n".join([*lines, "", provenance_line(res["provenance"]), ""])


def plot(res: dict, path: Path, target: float) -> None:
    """Each block's variants against the best length-blind one, with the declared ``target`` drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks = list(res["blocks"])
    variants = list(next(iter(res["blocks"].values()))["variants"])
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(variants)
    for j, v in enumerate(variants):
        r = [res["blocks"][b]["variants"][v]["vs_best_length_blind"] for b in blocks]
        xs = [i + j * width for i in range(len(blocks))]
        ax.bar(xs, [x["median"] for x in r], width, label=v,
               yerr=[[x["median"] - x["min"] for x in r], [x["max"] - x["median"] for x in r]], capsize=2)
    low = min(x["min"] for b in blocks for x in (res["blocks"][b]["variants"][v]["vs_best_length_blind"]
                                                 for v in variants))
    ax.set_ylim(bottom=max(0.0, min(0.9, low - 0.05)))
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(target, color="grey", lw=0.8, ls="--")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(blocks))], blocks)
    ax.set_ylabel("best length-blind makespan / variant's")
    ax.set_title(f"EMULATED: dispatch on {res['settings']['instances']} H20 instances (median and range of rounds)")
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
