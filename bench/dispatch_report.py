"""Markdown table and plot of ``bench/dispatch.py``'s results."""

from __future__ import annotations

from pathlib import Path

from bench.report_io import provenance_line

POLICIES = ("random", "round_robin", "least_loaded", "lpt", "streamrl", "streamrl_naive")


def _cell(m: dict, key: str, rnd: float) -> str:
    if key not in m:
        return "—"
    return f"{m[key]:.1f} ({rnd / m[key]:.2f}x)"


def _rs(x: dict) -> str:
    """A ratio with its spread over seeds; flags a spread as large as the effect."""
    flag = " (spread >= effect)" if x.get("spread_as_large_as_effect") else ""
    return f"{x['median']:.3f}x [{x['min']:.2f}-{x['max']:.2f}]{flag}"


def _regime_lines(r: dict) -> list[str]:
    g, pts = r["regime"], r["regime_search"]
    kept = r.get("ranker_kept_of_oracle_gain")
    lines = [
        "## Where length-aware dispatch should matter (regime search)",
        "",
        f"Grid: profile x lengths x rounds x dispatch unit x instances, {g['seeds']} workload seeds each (which "
        "prompts form the batch); every ratio is the median over seeds with its range [min-max]. Length-blind = "
        "round_robin and least_loaded, FCFS or LPT admission inside (LPT inside uses the ranker's estimates in ranker "
        "runs, true lengths in oracle runs); length-aware = lpt and streamrl dispatch, FCFS or LPT inside. Per point, "
        "the length-aware policy is the one whose **true-length** run gains the most; the ranker column is that same "
        "policy fed the ranker's estimates.",
        "",
        f"**Regime of record** ({g['selection']}): `{g['profile']}`, {g['lengths']} lengths, {g['rounds']} round(s), "
        f"dispatch by {g['unit']}, {g['instances']} instances, `{g['policy']}`. True lengths (oracle): "
        f"**{_rs(r['oracle_vs_round_robin'])}** vs round-robin, {_rs(r['oracle_vs_best_blind'])} vs the best "
        f"length-blind policy. Ranker estimates: **{_rs(r['ranker_vs_round_robin'])}** vs round-robin, "
        f"{_rs(r['ranker_vs_best_blind'])} vs the best length-blind policy"
        + (f"; the ranker keeps {kept:.0%} of the oracle's gain." if kept is not None else "."),
        "",
        "| profile | lengths | rounds | unit | N | policy (best with true lengths) | oracle vs best blind "
        "| ranker vs best blind | ranker vs round-robin | best ranker policy vs best blind |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in pts:
        lines.append(
            f"| {p['profile']} | {p['lengths']} | {p['rounds']} | {p['unit']} | {p['instances']} | {p['policy']} "
            f"| {_rs(p['oracle_vs_best_blind'])} | {_rs(p['ranker_vs_best_blind'])} "
            f"| {_rs(p['ranker_vs_round_robin'])} | `{p['best_ranker_policy']}` {_rs(p['best_ranker_vs_best_blind'])} |"
        )
    if r.get("estimate_sensitivity"):
        lines += [
            "",
            "How good must estimates be? The regime of record with synthetic estimates, true length x lognormal noise "
            "(one draw per prompt; sigma 0 = the truth), instead of the ranker's:",
            "",
            "| sigma | Spearman (history rows) | vs round-robin | vs best length-blind |",
            "|---|---|---|---|",
            *(f"| {x['sigma']:g} | {x['spearman']:.2f} | {_rs(x['ranker_vs_round_robin'])} "
              f"| {_rs(x['ranker_vs_best_blind'])} |"
              for x in r["estimate_sensitivity"]),
        ]
    return [*lines, ""]


def _header_lines(r: dict) -> list[str]:
    """The page's title, setting, and the long multi-round headline with its targets."""
    q = r["ranker_quality"]
    return [
        "# Dispatch benchmark: generation makespan by dispatch x admission policy",
        "",
        *([provenance_line(r["provenance"]), ""] if "provenance" in r else []),
        f"{r['instances']} instances, discrete-event simulation calling the SGS's own policy code; lengths in "
        f"{r['lengths_unit']}; makespan in seconds (speedup vs random dispatch with FCFS admission in brackets). "
        f"Ranker estimates: {r['estimates_label']} (`{r['estimates_file']}`; recall@20 {q['recall_at_20']:.2f}, @10 "
        f"{q['recall_at_10']:.2f}, @5 {q['recall_at_5']:.2f}, Spearman {q['spearman']:.2f}, n={q['n']}). `cpu` = "
        "measured CPU profile (tiny model, this host); `h20` = H20 x Qwen2.5-7B, **derived** from the spec sheet (not "
        f"measured on a GPU). Host: {r['host']}{'; --quick' if r['quick'] else ''}.",
        "",
        f"**Long multi-round, H20**: best ranker-driven `{r['best_ranker_policy']}` "
        f"{r['best_ranker_makespan_s']:.1f} s: **{r['speedup_vs_random']:.3f}x** vs random, "
        f"**{r['speedup_vs_random_by_prompt']:.3f}x** vs random dispatch of whole prompts, "
        f"**{r['speedup_vs_best_baseline']:.3f}x** vs the best baseline (`{r['best_baseline']}`), "
        f"**{r['ranker_vs_oracle']:.3f}** of the same policy with true lengths. Targets: "
        + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in r["targets"].items()) + ".",
        "",
    ]


def _regime_table(regime: str, m: dict) -> list[str]:
    """One fixed regime's makespans: each dispatch policy by estimates (ranker, oracle) and admission."""
    rnd = m["random+fcfs"]
    lines = [
        f"### {regime}",
        "",
        "| dispatch (per sample unless by prompt) | ranker, FCFS inside | ranker, LPT inside | oracle, FCFS inside "
        "| oracle, LPT inside |",
        "|---|---|---|---|---|",
    ]
    for p in POLICIES + tuple(f"{q}@prompt" for q in ("random", "round_robin", "lpt", "streamrl")):
        if f"{p}+fcfs" not in m:
            continue
        cells = [
            _cell(m, f"{p}+fcfs", rnd), _cell(m, f"{p}+lpt", rnd),
            (_cell(m, f"{p}+fcfs/oracle", rnd) if f"{p}+fcfs/oracle" in m or "@" in p
             else "= ranker (no estimates used)"),
            _cell(m, f"{p}+lpt/oracle", rnd),
        ]
        label = p.replace("@prompt", " (by prompt)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _real_lines(real: dict) -> list[str]:
    """The real engines' runs against the simulator's replay of them."""
    lines = [
        f"## Real engines ({real['instances']} instance processes + router, tiny model, forced lengths, "
        f"{real['samples']} samples, lengths capped at {real['length_cap_tokens']} tokens, max_inflight "
        f"{real['max_inflight']})",
        "",
        f"Simulator error (the router's actual assignment replayed on the step cost profiled in situ): mean "
        f"**{real['sim_error']:.3f}**, max {real['sim_error_max']:.3f}; with the shipped `braid profile` file "
        f"{real['sim_error_shipped_profile']:.3f}"
        + (f"; **calibrated** (the in-situ profile scaled on a separate run: {real['calibration']['samples']} "
           f"samples of rows outside the batch through `{real['calibration']['router']}`, scale "
           f"x{real['calibration']['scale']:.2f}) **{real['sim_error_calibrated']:.3f}** (max "
           f"{real['sim_error_calibrated_max']:.3f})" if "calibration" in real else "")
        + (f"; the shipped profile scaled on the same run (x{real['shipped_calibration']['scale']:.2f}) "
           f"{real['sim_error_shipped_calibrated']:.3f}" if "shipped_calibration" in real else "")
        + f". Noise floor: repeats of one configuration differed by "
        f"{real['measurement_spread']:.3f} on average (fastest of {real['repeats']} kept).",
        "",
        "| configuration | measured s | simulated s (in situ) | error | simulated s (shipped) "
        "| simulated s (calibrated) | simulated s (shipped, scaled) | speedup vs random (measured) | (simulated) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for k, run in real["runs"].items():
        err = abs(run["simulated_s"] - run["measured_s"]) / run["measured_s"]
        calibrated = f"{run['simulated_calibrated_s']:.2f}" if "simulated_calibrated_s" in run else "—"
        shipped_cal = (f"{run['simulated_shipped_calibrated_s']:.2f}" if "simulated_shipped_calibrated_s" in run
                       else "—")
        lines.append(
            f"| {k} | {run['measured_s']:.2f} | {run['simulated_s']:.2f} | {err:.3f} "
            f"| {run['simulated_shipped_s']:.2f} | {calibrated} | {shipped_cal} "
            f"| {real['speedup_vs_random_measured'][k]:.2f}x | {real['speedup_vs_random_simulated'][k]:.2f}x |"
        )
    return [*lines, ""]


def markdown(r: dict) -> str:
    lines = [
        *_header_lines(r),
        *(_regime_lines(r) if "regime" in r else []),
        f"## Fixed regimes, {r['instances']} instances, workload seed "
        f"{r.get('provenance', {}).get('config', {}).get('seed', 0)}",
        "",
    ]
    for regime, m in r["makespan_s"].items():
        lines += _regime_table(regime, m)
    if "real" in r:
        lines += _real_lines(r["real"])
    return "\n".join(lines)


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = list(r["makespan_s"])
    configs = [("round_robin+fcfs", "round-robin"), ("lpt+lpt", "global LPT (ranker)"),
               ("streamrl+lpt", "StreamRL refined (ranker)"), ("streamrl_naive+lpt", "StreamRL as written (ranker)"),
               ("streamrl+lpt/oracle", "StreamRL refined (oracle)")]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(configs)
    for j, (key, label) in enumerate(configs):
        vals = [r["makespan_s"][g]["random+fcfs"] / r["makespan_s"][g][key] for g in regimes]
        ax.bar([i + j * width for i in range(len(regimes))], vals, width, label=label)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(regimes))], regimes, rotation=20)
    ax.set_ylabel("speedup vs random dispatch")
    ax.set_title("Generation makespan, 8 instances (simulated; h20 = derived profile)")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
