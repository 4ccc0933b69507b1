"""Markdown table and plot of ``bench/dispatch.py``'s results."""

from __future__ import annotations

from pathlib import Path

from bench.report_io import provenance_line

POLICIES = ("random", "round_robin", "least_loaded", "lpt", "streamrl", "streamrl_naive")


def _cell(m: dict, key: str, rnd: float) -> str:
    if key not in m:
        return "—"
    return f"{m[key]:.1f} ({rnd / m[key]:.2f}x)"


def markdown(r: dict) -> str:
    q = r["ranker_quality"]
    lines = [
        "# Dispatch benchmark: generation makespan by dispatch x admission policy",
        "",
        *([provenance_line(r["provenance"]), ""] if "provenance" in r else []),
        f"{r['instances']} instances, discrete-event simulation calling the SGS's own policy code; lengths in "
        f"{r['lengths_unit']}; makespan in seconds (speedup vs random dispatch with FCFS admission in brackets). "
        f"Ranker estimates: {r['estimates_label']} (`{r['estimates_file']}`; recall@20 {q['recall_at_20']:.2f}, @10 {q['recall_at_10']:.2f}, "
        f"@5 {q['recall_at_5']:.2f}, Spearman {q['spearman']:.2f}, n={q['n']}). `cpu` = measured CPU profile "
        "(tiny model, this host); `h20` = H20 x Qwen2.5-7B, **derived** from the spec sheet (not measured on a GPU). "
        f"Host: {r['host']}{'; --quick' if r['quick'] else ''}.",
        "",
        f"**Long multi-round, H20**: best ranker-driven `{r['best_ranker_policy']}` "
        f"{r['best_ranker_makespan_s']:.1f} s: **{r['speedup_vs_random']:.3f}x** vs random, "
        f"**{r['speedup_vs_random_by_prompt']:.3f}x** vs random dispatch of whole prompts, "
        f"**{r['speedup_vs_best_baseline']:.3f}x** vs the best baseline (`{r['best_baseline']}`), "
        f"**{r['ranker_vs_oracle']:.3f}** of the same policy with true lengths. Targets: "
        + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in r["targets"].items()) + ".",
        "",
    ]
    for regime, m in r["makespan_s"].items():
        rnd = m["random+fcfs"]
        lines += [
            f"## {regime}",
            "",
            "| dispatch (per sample unless by prompt) | ranker, FCFS inside | ranker, LPT inside | oracle, FCFS inside | oracle, LPT inside |",
            "|---|---|---|---|---|",
        ]
        for p in POLICIES + tuple(f"{q}@prompt" for q in ("random", "round_robin", "lpt", "streamrl")):
            if f"{p}+fcfs" not in m:
                continue
            cells = [
                _cell(m, f"{p}+fcfs", rnd), _cell(m, f"{p}+lpt", rnd),
                _cell(m, f"{p}+fcfs/oracle", rnd) if f"{p}+fcfs/oracle" in m or "@" in p else "= ranker (no estimates used)",
                _cell(m, f"{p}+lpt/oracle", rnd),
            ]
            label = p.replace("@prompt", " (by prompt)")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    if "real" in r:
        real = r["real"]
        lines += [
            f"## Real engines ({real['instances']} instance processes + router, tiny model, forced lengths, "
            f"{real['samples']} samples, lengths capped at {real['length_cap_tokens']} tokens, max_inflight {real['max_inflight']})",
            "",
            f"Simulator error (the router's actual assignment replayed on the step cost profiled in situ): mean "
            f"**{real['sim_error']:.3f}**, max {real['sim_error_max']:.3f}; with the shipped `braid profile` file "
            f"{real['sim_error_shipped_profile']:.3f}. Noise floor: repeats of one configuration differed by "
            f"{real['measurement_spread']:.3f} on average (fastest of {real['repeats']} kept).",
            "",
            "| configuration | measured s | simulated s | error | speedup vs random (measured) | (simulated) |",
            "|---|---|---|---|---|---|",
        ]
        for k, run in real["runs"].items():
            err = abs(run["simulated_s"] - run["measured_s"]) / run["measured_s"]
            lines.append(
                f"| {k} | {run['measured_s']:.2f} | {run['simulated_s']:.2f} | {err:.3f} | "
                f"{real['speedup_vs_random_measured'][k]:.2f}x | {real['speedup_vs_random_simulated'][k]:.2f}x |"
            )
        lines.append("")
    return "\n".join(lines)


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = list(r["makespan_s"])
    configs = [("round_robin+fcfs", "round-robin"), ("lpt+lpt", "global LPT (ranker)"), ("streamrl+lpt", "StreamRL refined (ranker)"),
               ("streamrl_naive+lpt", "StreamRL as written (ranker)"), ("streamrl+lpt/oracle", "StreamRL refined (oracle)")]
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
