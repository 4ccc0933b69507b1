"""Rendering of ``bench/trl_fair.py``'s result: the markdown report and its plot (pure: no runs)."""

from __future__ import annotations

import math
from pathlib import Path


def _f(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)


def _rs(x: dict | None) -> str:
    if not x:
        return "—"
    flag = " **(spread >= effect)**" if x.get("spread_as_large_as_effect") else ""
    return f"{x['median']:.2f}x [{x['min']:.2f}–{x['max']:.2f}]{flag}"


def target_resolution(result: dict) -> float | None:
    """How many of the warm start's standard errors the target lies above it (None: no target)."""
    target, warm = result["time_to_target_s"]["target"], result["warmstart_accuracy"]
    if target is None or not warm["stderr"]:
        return None
    return (target - warm["accuracy"]) / warm["stderr"]


def _target_caveat(result: dict) -> list[str]:
    z = target_resolution(result)
    if z is None or z >= 2.0:
        return []
    every = result["matched"]["checkpoint_every"]
    return [
        f"**Caution on time to target:** the target is only {z:.1f} standard errors of one checkpoint's "
        f"evaluation above the warm start (these runs gain little in {result['matched']['iterations']} steps), "
        f"and checkpoints come every {every} steps, so time to target mostly restates the time per step; it "
        "is not a resolved comparison of learning per step.",
        "",
    ]


def final_accuracy_note(result: dict) -> str:
    """The two systems' mean final accuracies, and whether they differ by more than 2 standard errors
    of the difference (binomial standard errors of the runs, averaged over the runs)."""
    fa = result["final_accuracy"]
    b, t = fa["braid"], fa["trl"]
    se = math.sqrt(sum(x * x for x in b["stderr_per_run"]) / len(b["stderr_per_run"]) ** 2
                   + sum(x * x for x in t["stderr_per_run"]) / len(t["stderr_per_run"]) ** 2)
    diff = b["mean"] - t["mean"]
    verdict = "within noise (<= 2 standard errors)" if abs(diff) <= 2 * se else "more than 2 standard errors apart"
    return (f"Final accuracy, mean over runs: Braid {b['mean']:.3f}, TRL {t['mean']:.3f}; difference {diff:+.3f} "
            f"± {se:.3f}: {verdict}.")


def _thread_lines(result: dict) -> list[str]:
    """TRL's thread scaling (runs since 2026-11-28): which thread count the comparison took."""
    sc = result.get("trl_thread_scaling")
    if not sc:
        return []
    per = ", ".join(f"{t} thread{'s' if t != '1' else ''} {_f(v['median'])} [{_f(v['min'])}–{_f(v['max'])}]"
                    for t, v in sc["threads"].items())
    ratio = next(v for k, v in sc.items() if k.endswith("_vs_1_threads"))
    return [f"TRL's samples/s on the same 2 cores, interleaved: {per}; more threads / 1 thread per round "
            f"{_rs(ratio)}. The table compares Braid with TRL at {result.get('trl_threads_compared')} thread(s), "
            "its faster setting.", ""]


def _summary_table(result: dict) -> list[str]:
    """Braid against TRL over the pairs: rates, lengths, time to target, final accuracy."""
    sp, tt = result["spread"], result["time_to_target_s"]
    return [
        "| | Braid sync (hf engine) | TRL GRPOTrainer (generate) | Braid / TRL per pair: median [range] |",
        "|---|---|---|---|",
        f"| samples/s | {_f(sp['samples_per_s']['braid']['median'])} [{_f(sp['samples_per_s']['braid']['min'])}–"
        f"{_f(sp['samples_per_s']['braid']['max'])}] | {_f(sp['samples_per_s']['trl']['median'])} "
        f"[{_f(sp['samples_per_s']['trl']['min'])}–{_f(sp['samples_per_s']['trl']['max'])}] | "
        f"{_rs(sp['samples_per_s_ratio'])} |",
        f"| tokens/s (completion) | {_f(sp['tokens_per_s']['braid']['median'], '.0f')} "
        f"[{_f(sp['tokens_per_s']['braid']['min'], '.0f')}–{_f(sp['tokens_per_s']['braid']['max'], '.0f')}] | "
        f"{_f(sp['tokens_per_s']['trl']['median'], '.0f')} [{_f(sp['tokens_per_s']['trl']['min'], '.0f')}–"
        f"{_f(sp['tokens_per_s']['trl']['max'], '.0f')}] | {_rs(sp['tokens_per_s_ratio'])} |",
        f"| completion tokens per sample | {_f(sp['response_len_mean']['braid']['median'])} | "
        f"{_f(sp['response_len_mean']['trl']['median'])} | |",
        f"| time to target (s), median | {_f(tt['braid_median'])} ({tt['reached']['braid']}/{result['runs']} reached) "
        f"| {_f(tt['trl_median'])} ({tt['reached']['trl']}/{result['runs']} reached) "
        f"| TRL / Braid time: {_rs(tt['trl_over_braid'])} |",
        f"| final accuracy, mean | {_f(result['final_accuracy']['braid']['mean'], '.3f')} | "
        f"{_f(result['final_accuracy']['trl']['mean'], '.3f')} | |",
    ]


def _per_run_rows(result: dict) -> list[str]:
    """Each interleaved pair's own rates and finals."""
    b, t = result["per_run"]["braid"], result["per_run"]["trl"]
    lines = []
    for i, (rb, rt) in enumerate(zip(b, t, strict=True)):
        lines.append(
            f"| {i} | {rb['samples_per_s']:.1f} | {rt['samples_per_s']:.1f} "
            f"| {rb['samples_per_s'] / rt['samples_per_s']:.2f} | {rb['tokens_per_s']:.0f} | {rt['tokens_per_s']:.0f} "
            f"| {rb['tokens_per_s'] / rt['tokens_per_s']:.2f} | {rb['final_accuracy']:.3f} "
            f"| {rt['final_accuracy']:.3f} | {_f(rb.get('trained_fraction'), '.3f')} |"
        )
    return lines


def markdown(result: dict) -> str:
    from bench.report_io import provenance_line

    tt, m = result["time_to_target_s"], result["matched"]
    lines = [
        "# A fair TRL run: Braid sync vs TRL GRPOTrainer, matched settings",
        "",
        f"{result['runs']} runs per system, interleaved (Braid, TRL, Braid, TRL, ...), on {m['cores']} cores. "
        "**The matched pair is Braid's `hf` engine vs TRL's `generate`** (both: one static batch per step on "
        "transformers' stock attention). Braid's default vLLM engine is **not** matched here: TRL's vLLM path "
        "does not run on this CPU machine (see below).",
        "",
        *_thread_lines(result),
        *_summary_table(result),
        "",
        f"Warm start {result['warmstart_accuracy']['accuracy']:.3f} ± {result['warmstart_accuracy']['stderr']:.3f}; "
        f"target {_f(tt['target'], '.3f')} ({tt['rule']}). A ratio flagged **(spread >= effect)** has a range "
        "across pairs at least as large as its distance from 1: not resolved by these runs.",
        "",
        *_target_caveat(result),
        final_accuracy_note(result),
        "",
        "Definitions (identical for both): samples/s = completions generated and trained per second of steady "
        "RL wall time, from the end of optimizer step 0 to the end of the last step (step 0 excluded); tokens/s "
        "= completion tokens (stop token included, prompt tokens not) over the same time.",
        "",
        "## Per run (interleaved order)",
        "",
        "| pair | Braid samples/s | TRL samples/s | ratio | Braid tokens/s | TRL tokens/s | ratio | Braid final "
        "| TRL final | Braid trained/generated |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += _per_run_rows(result)
    lines += ["", "## Matched settings", ""]
    for k, v in m.items():
        if k not in ("model", "task"):
            lines.append(f"- `{k}`: {'off' if v is None else v}")
    lines += ["", "## What still differs", ""] + [f"- {x}" for x in result["still_differs"]]
    trl_info = result.get("trl") or {}
    lines += [
        "",
        f"TRL {trl_info.get('versions', {}).get('trl', '?')} (optimizer {trl_info.get('optim', '?')}); "
        f"whole benchmark {result['bench_wall_s'] / 60:.1f} min.",
        "",
        provenance_line(result["provenance"]),
        "",
    ]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for system, color in (("braid", "tab:blue"), ("trl", "tab:orange")):
        for i, r in enumerate(result["per_run"][system]):
            xs, ys = [p[0] for p in r["curve"]], [p[1] for p in r["curve"]]
            ax1.plot(xs, ys, "o-", color=color, alpha=0.7,
                     label=f"{'Braid sync (hf)' if system == 'braid' else 'TRL (generate)'}" if i == 0 else None)
    target = result["time_to_target_s"]["target"]
    if target is not None:
        ax1.axhline(target, color="gray", ls="--", lw=1, label="target")
    ax1.set_xlabel("RL wall time (s)")
    ax1.set_ylabel("held-out accuracy")
    ax1.set_title("accuracy over time, every run")
    ax1.legend()
    pairs = range(result["runs"])
    w = 0.38
    ax2.bar([p - w / 2 for p in pairs], [r["samples_per_s"] for r in result["per_run"]["braid"]], w,
            label="Braid sync (hf)")
    ax2.bar([p + w / 2 for p in pairs], [r["samples_per_s"] for r in result["per_run"]["trl"]], w,
            label="TRL (generate)")
    ax2.set_xticks(list(pairs), [f"pair {p}" for p in pairs])
    ax2.set_ylabel("samples/s (steady)")
    ax2.set_title(f"Braid/TRL samples/s: {_rs(result['spread']['samples_per_s_ratio'])}".replace("**", ""))
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
