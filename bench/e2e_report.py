"""Rendering of ``bench/e2e.py``'s results: the markdown table of ratios and the curves PNG."""

from __future__ import annotations

import time
from pathlib import Path

from bench.e2e_core import CONTROLS_WHAT, NEGATIVE_CONTROL_EXPECTED, PLACEBO, PLACEBO_LR
from bench.report_io import provenance_line


def fmt(x: float | None, spec: str = ".1f", none: str = "—") -> str:
    return none if x is None else format(x, spec)


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "—"


def when(ts: float | None) -> str:
    """A mode's start time: modes reused from an earlier invocation (``--reuse``) show it."""
    return time.strftime("%m-%d %H:%M", time.gmtime(ts)) if ts else "—"


def with_stderr(d: dict, key: str, spec: str) -> str:
    """``mean ± s.e. (n runs)`` for a mode measured several times (``--repeats``), else the value."""
    runs = d.get("runs") or []
    if len(runs) < 2 or d.get(f"{key}_stderr") is None:
        return fmt(d.get(key), spec)
    return f"{fmt(d[key], spec)} ± {fmt(d[f'{key}_stderr'], spec)} ({len(runs)} runs)"


def ratio_with_stderr(result: dict, a: str, b: str) -> str:
    """samples/s of mode ``a`` over mode ``b``, with the propagated standard error when both were repeated."""
    da, db = result["modes"].get(a, {}), result["modes"].get(b, {})
    va, vb = da.get("samples_per_s"), db.get("samples_per_s")
    if not va or not vb or da.get("status") != "ok" or db.get("status") != "ok":
        return "—"
    r = va / vb
    sa, sb = da.get("samples_per_s_stderr"), db.get("samples_per_s_stderr")
    if sa is None or sb is None:
        return f"{r:.2f}x"
    return f"{r:.2f}x ± {r * ((sa / va) ** 2 + (sb / vb) ** 2) ** 0.5:.2f}"


def _header_lines(result: dict) -> list[str]:
    """The page's title, what ran on what, the provenance, the target, and the table's head."""
    s_trl = result["samples_per_s"].get("trl")
    m = result["settings"]
    trl_clause = (f"TRL {result['host'].get('trl_version') or '—'} (generation backend: {m['trl_generation']}; "
                  f"one process, {m['trl_threads']} threads)." if s_trl else "")
    return [
        "# End-to-end benchmark: Braid's pipeline modes"
        f"{' vs TRL GRPOTrainer' if s_trl else ''} (CPU, tiny model, one run per mode)",
        "",
        f"{'QUICK run (--quick): few iterations, a smoke test of the harness, not a result. ' if m['quick'] else ''}"
        f"{m['iterations']} optimizer steps x {m['samples_per_iteration']} samples per mode; checkpoints every "
        f"{m['checkpoint_every']} steps scored offline on {m['eval_prompts']} held-out prompts ({m['decoding']}). "
        f"Host: {result['host']['summary']}. "
        f"{trl_clause} Braid: {m['instances']} SGS instance(s) in every mode "
        f"and the trainer, one torch thread per process, engine **{result.get('engine', 'cb')}**"
        f"{' (SGS processes pinned to CPU 0, the trainer to CPU 1: disaggregated stages)' if m.get('pinned') else ''}.",
        "",
        *([provenance_line(p), ""] if (p := result.get("provenance")) else []),
        (
            f"Target accuracy: **{fmt(result['target_accuracy'], '.3f')}** ({result['target_rule']}); "
            f"warm start {result['warmstart']['accuracy']:.3f} ± {result['warmstart']['stderr']:.3f}."
        ),
        "",
        "| mode | samples/s | vs sync | vs TRL | tokens/s | vs sync | time to target (s) | final accuracy "
        "| staleness (groups by V_buf - V_traj) | measured (UTC) | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]


def _mode_row(result: dict, mode: str) -> str:
    """One mode's row: its rates against sync and TRL, time to target, final accuracy, staleness."""
    sps, tps = result["samples_per_s"], result.get("tokens_per_s", {})
    s_sync, s_trl, t_sync = sps.get("sync"), sps.get("trl"), tps.get("sync")
    final, se = result["final_accuracy"], result["accuracy_stderr"]
    d = result["modes"].get(mode, {})
    hist = d.get("staleness", {}).get("total_hist") if mode != "trl" else None
    hist_s = ", ".join(f"{k}: {v}" for k, v in hist.items()) if hist else "—"
    s = sps[mode]
    return (
        f"| {mode} | {with_stderr(d, 'samples_per_s', '.1f') if s else fmt(s)} "
        f"| {fmt(s / s_sync if s and s_sync else None, '.2f')}{'x' if s and s_sync else ''} "
        f"| {fmt(s / s_trl if s and s_trl else None, '.2f')}{'x' if s and s_trl else ''} "
        f"| {with_stderr(d, 'tokens_per_s', '.0f') if s else '—'} | {ratio(tps.get(mode), t_sync)} "
        f"| {fmt(result['time_to_target_s'][mode])} "
        f"| {fmt(final[mode], '.3f')}{' ± ' + fmt(se[mode], '.3f') if final[mode] is not None else ''} | {hist_s} "
        f"| {when(d.get('started_at'))} | {result['status'][mode].splitlines()[0][:80].replace('|', '/')} |"
    )


def markdown(result: dict) -> str:
    m = result["settings"]
    lines = [*_header_lines(result), *(_mode_row(result, mode) for mode in result["status"])]
    t = result["targets"]
    lines += [
        "",
        f"Staleness-bound violations over Braid's modes: **{result['max_staleness_violations']}** (must be 0).",
        "",
        "Targets (from the issue):",
        "",
        f"- one_step >= 1.25x sync samples/s: {t['one_step_ge_1.25x_sync']} "
        f"(one_step / sync = {ratio_with_stderr(result, 'one_step', 'sync')})",
        f"- bounded eta=2 >= one_step samples/s: {t['bounded_2_ge_one_step']} "
        f"(bounded_2 / one_step = {ratio_with_stderr(result, 'bounded_2', 'one_step')})",
        f"- every Braid mode ahead of TRL in samples/s: {t['every_braid_mode_ahead_of_trl']}",
        f"- async modes non-inferior to sync in held-out accuracy: {t['async_noninferior_to_sync']}",
        "",
        *convergence_lines(result),
        *trl_fair_lines(result),
        *interleaved_lines(result),
        "![accuracy vs wall time](e2e_curves.png)",
        "",
        (
            "Accuracy curves (rl seconds, accuracy ± stderr) and the staleness distribution of every consumed "
            "buffer are in `e2e.json` (`modes.<mode>.curve`, `modes.<mode>.staleness.buffers`). Wall times are "
            "CPU times on a noisy 2-core machine: compare ratios, not absolutes. *tokens/s*: response tokens per "
            "second (the policies drift to different response lengths, which samples/s alone hides). *measured*: "
            "when the mode's run started; modes kept from an earlier invocation (`--reuse`) ran under that "
            "time's machine load. With `--repeats N` (here "
            f"{m.get('repeats', 1)}) each Braid mode ran N times (the scored run, then throughput-only runs with "
            "other sampling seeds, same data order): samples/s and tokens/s are the mean ± standard error of the "
            "runs, the ratios are of the means, and the per-run values are in `e2e.json` (`modes.<mode>.runs`)."
        ),
    ]
    return "\n".join(lines) + "\n"


def convergence_lines(result: dict) -> list[str]:
    """The non-inferiority table (``e2e_stats``), or nothing when the run had no paired evaluation."""
    conv = result.get("convergence")
    if not conv:
        return []
    g, m = conv["sync_gain"], result["settings"]
    margin = conv["margin"]
    lines = [
        "## Convergence: paired non-inferiority against sync",
        "",
        (
            f"Final checkpoints scored on the same {m.get('paired_prompts')} held-out prompts x "
            f"{m.get('paired_samples')} samples (same random stream per prompt chunk); per prompt, the difference "
            f"of mean rewards. Sync's gain over the warm start: **{g['diff']:+.4f}** (95% CI "
            f"[{g['ci95'][0]:+.4f}, {g['ci95'][1]:+.4f}]) = **{conv['sync_gain_se']:.1f} standard errors** "
            f"({'has' if conv['powered'] else 'LACKS'} the power asked for, >= {conv['min_gain_se']:g}). "
            f"Margin: {conv['margin_rule']} = {fmt(margin, '.4f')}. A mode passes when its whole interval lies "
            "above -margin (*non-inferior*); *inferior* when it lies below; otherwise *inconclusive*."
        ),
        "",
        "| mode | accuracy (paired set) | diff to sync | 95% CI | verdict |",
        "|---|---|---|---|---|",
    ]
    rows = [*result.get("noninferiority", {}).items(),
            *((f"{k} (negative control)", v) for k, v in conv["negative_control"].items())]
    for name, v in rows:
        lines.append(f"| {name} | {v['mean_accuracy']:.4f} | {v['diff']:+.4f} | "
                     f"[{v['ci95'][0]:+.4f}, {v['ci95'][1]:+.4f}] | {v['verdict']} |")
    flagged = f"Every control not passing (the earlier check): {conv['negative_control_flagged']}."
    if result.get("declared_controls") is None:  # a result written before declared_controls: as it said then
        lines += ["", f"Declared negative control ({PLACEBO}: sync at lr {PLACEBO_LR:g}, every step taken, nothing "
                      f"learned): **{result.get('negative_control_verdict')}** (must be {NEGATIVE_CONTROL_EXPECTED}). "
                      f"{flagged}", ""]
    else:
        lines += ["", *declared_control_lines(result["declared_controls"], result.get("declared_controls_met")),
                  flagged, ""]
    return lines + previous_regime_lines(result)


def declared_control_lines(declared: dict, all_met: bool | None) -> list[str]:
    """Each declared control's verdict against the one declared for it before the run: met, or FAILED."""
    lines = [f"Declared negative controls, each with the verdict declared for it before the run "
             f"(all met: **{all_met}**):", ""]
    for name, d in declared.items():
        judged = (f"**{d['verdict']}** ({d['diff']:+.4f}, 95% CI [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}])"
                  if d["verdict"] is not None else f"**{d.get('note', 'not judged')}**")
        lines.append(f"- {name} ({CONTROLS_WHAT.get(name, 'declared')}): {judged}; must be {d['expected']}: "
                     f"{'met' if d['met'] else '**FAILED**'}")
    return [*lines, ""]


def previous_regime_lines(result: dict) -> list[str]:
    """The verdicts of the regime this run replaced (kept beside the new ones, ``previous_regime``)."""
    prev = result.get("previous_regime")
    if not prev or not prev.get("noninferiority"):
        return []
    reg, prov = prev["regime"], prev.get("provenance") or {}
    steps = reg.get("warmstart_steps") or "the config's own"
    paired = f", {reg['paired_samples']} paired samples a prompt" if reg.get("paired_samples") else ""
    verdicts = ", ".join(f"{m} {v['verdict']} ({v['diff']:+.4f})" for m, v in prev["noninferiority"].items())
    return [
        f"Previous regime (warm start: {steps} SFT steps, {reg.get('iterations')} RL steps{paired}; "
        f"{str(prov.get('commit', '?'))[:7]}, {prov.get('date', '?')}): warm start "
        f"{prev['warmstart']['accuracy']:.3f}, sync's gain {prev.get('sync_gain_se', float('nan')):.1f} standard "
        f"errors; {verdicts}.",
        "",
    ]


def trl_fair_lines(result: dict) -> list[str]:
    """The matched TRL comparison (``bench/trl_fair.py``), when the results file carries it."""
    f = result.get("trl_fair")
    if not f:
        return []
    part = result.get("provenance", {}).get("parts", {}).get("trl_fair", "measured by bench/trl_fair.py")
    return [
        "## TRL, matched (`bench/trl_fair.py`, `trl_fair.md`)",
        "",
        f"Braid sync / TRL GRPOTrainer with matched settings, {f['runs']} interleaved runs each: samples/s "
        f"**{f['samples_per_s_ratio']:.2f}x**, completion tokens/s **{f['tokens_per_s_ratio']:.2f}x** ({part}).",
        "",
    ]


def interleaved_lines(result: dict) -> list[str]:
    """The throughput ratios of record (``bench/e2e_throughput.py``), when the results file carries them."""
    t = result.get("throughput_interleaved")
    if not t:
        return []
    part = result.get("provenance", {}).get("parts", {}).get("throughput_interleaved",
                                                             "measured by bench/e2e_throughput.py")
    lines = [
        "## Throughput, interleaved rounds (`bench/e2e_throughput.py`, `e2e_throughput.md`)",
        "",
        f"The ratios of record: median of {t['settings']['rounds']} interleaved rounds, per-round ratios, range in "
        f"brackets ({part}). The single-run samples/s above are this run's own.",
        "",
        "| ratio | samples/s | tokens/s |",
        "|---|---|---|",
    ]
    for name, v in t["ratios"].items():
        cells = [f"{v[k]['median']:.2f}x [{v[k]['min']:.2f}–{v[k]['max']:.2f}]"
                 + (" (spread as large as the effect)" if v[k]["spread_as_large_as_effect"] else "")
                 for k in ("samples_per_s", "tokens_per_s")]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    return [*lines, ""]


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    for mode, d in result["modes"].items():
        if d.get("status") != "ok":
            continue
        t, acc, se = zip(*d["curve"], strict=True)
        ax.errorbar(t, acc, yerr=se, marker="o", ms=3, capsize=2, elinewidth=0.7, alpha=0.85,
                    lw=2.2 if mode in ("sync", "trl") else 1.2,
                    ls="--" if mode == "trl" else "-", label=f"{mode} ({d['samples_per_s']:.0f} samples/s)")
    if result["target_accuracy"] is not None:
        ax.axhline(result["target_accuracy"], color="grey", ls=":", label="target")
    ax.set_xlabel("RL wall time (s)")
    ax.set_ylabel(f"held-out accuracy ({result['settings']['eval_prompts']} prompts)")
    ax.set_title("Accuracy vs wall time")
    ax.legend(fontsize=7)
    stale = {m: d["staleness"]["total_hist"] for m, d in result["modes"].items()
             if d.get("status") == "ok" and "staleness" in d}
    levels = sorted({int(s) for h in stale.values() for s in h})
    bottom = [0.0] * len(stale)
    for level in levels:
        frac = [h.get(str(level), 0) / max(1, sum(h.values())) for h in stale.values()]
        bx.bar(list(stale), frac, bottom=bottom, label=f"staleness {level}")
        bottom = [b + f for b, f in zip(bottom, frac, strict=True)]
    bx.set_ylabel("fraction of trained groups")
    bx.set_title("Staleness of consumed trajectories (all buffers)")
    bx.tick_params(axis="x", rotation=45, labelsize=7)
    if levels:
        bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
