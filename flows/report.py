"""Run report: PNG plots and ``report.md`` from a run directory's metrics, timeline and summary."""

from __future__ import annotations

import json
from pathlib import Path

from flows.online_ranker import report_lines
from flows.plots import plt, save_figure
from flows.report_suites import banner, plot_suites, suite_lines


def _load(run_dir: Path) -> tuple[list[dict], dict, dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    timeline = json.loads((run_dir / "timeline.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    return rows, timeline, summary


def plot_learning(rows: list[dict], summary: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    its = [r["iteration"] + 1 for r in rows]
    ax.plot(its, [r["reward_mean"] for r in rows], label="training reward (mean over samples)", color="tab:blue")
    n = summary["iterations"]
    ax.errorbar(
        [0, n],
        [summary["warmstart_accuracy"], summary["final_accuracy"]],
        yerr=[summary["warmstart_stderr"], summary["accuracy_stderr"]],
        fmt="o",
        color="tab:red",
        capsize=4,
        label=f"held-out accuracy ({summary['eval_prompts']} prompts, ±1 s.e.)",
    )
    ax.set_xlabel("iteration (optimizer step)")
    ax.set_ylabel("reward / accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    emulated = "EMULATED: synthetic tokens, reward at a declared rate; " if "emulated" in summary else ""
    ax.set_title(f"Learning curve ({emulated}{summary['mode']})")
    save_figure(fig, path)


def plot_timeline(timeline: dict, path: Path, max_iterations: int = 12, time_scale: float | None = None) -> None:
    """Generation vs training per iteration over wall time (StreamRL Figure 5 style); an EMULATED
    run's (``time_scale``) says so and labels the axis in wall seconds (modelled = wall / scale)."""
    gen = [g for g in timeline["generation"] if g[0] < max_iterations]
    train = [t for t in timeline["training"] if t[0] < max_iterations]
    if not gen:
        return
    t0 = min(g[1] for g in gen)
    fig, ax = plt.subplots(figsize=(9, 2.8))
    colors = plt.cm.tab20.colors
    for k, start, end in gen:  # alternate sub-rows: overlapping windows (one_step) stay visible
        y = 0.85 + 0.35 * (int(k) % 2)
        ax.barh(y, end - start, left=start - t0, height=0.3, color=colors[int(k) % 20], edgecolor="black", lw=0.4)
        ax.text((start + end) / 2 - t0, y, str(int(k)), ha="center", va="center", fontsize=7)
    for k, start, end in train:
        ax.barh(0, end - start, left=start - t0, height=0.6, color=colors[int(k) % 20], edgecolor="black", lw=0.4)
    ax.set_yticks([0, 1.02], ["training", "generation"])
    ax.set_xlabel("seconds since the first iteration's generation started (labels: iteration)"
                  + (f"; EMULATED wall seconds, modelled = wall / {time_scale:g}" if time_scale else ""))
    shown = min(max_iterations, len(gen))
    ax.set_title(("EMULATED " if time_scale else "") + f"Stage timeline, first {shown} iterations")
    ax.grid(axis="x", alpha=0.3)
    save_figure(fig, path)


def plot_staleness(rows: list[dict], path: Path) -> bool:
    """Staleness (V_buf - V_traj) of the groups in each consumed buffer, stacked (StaleFlow Fig. 18)."""
    hists = [r.get("entry_staleness_hist") for r in rows]
    if not any(hists):
        return False
    eta = max(int(r.get("eta", 0)) for r in rows)
    fig, ax = plt.subplots(figsize=(8, 3.2))
    bottom = [0.0] * len(rows)
    its = [r["iteration"] for r in rows]
    colors = plt.cm.viridis
    for s in range(eta + 1):
        counts = [float((h or {}).get(str(s), 0)) for h in hists]
        totals = [max(1.0, sum((h or {}).values())) for h in hists]
        share = [c / t for c, t in zip(counts, totals, strict=True)]
        ax.bar(its, share, bottom=bottom, color=colors(s / max(1, eta)), label=f"staleness {s}", width=0.9)
        bottom = [b + x for b, x in zip(bottom, share, strict=True)]
    ax.set_xlabel("consumed buffer (iteration)")
    ax.set_ylabel("share of groups")
    ax.set_ylim(0, 1)
    ax.set_title(f"Staleness per consumed buffer (bound eta = {eta})")
    ax.legend(fontsize=7, ncol=eta + 1, loc="upper center", bbox_to_anchor=(0.5, -0.22))
    save_figure(fig, path)
    return True


def plot_lengths(rows: list[dict], path: Path) -> bool:
    """Output-length distribution (tokens per sample) of the first and the last quarter of the
    iterations: the long tail the pipeline has to hide, and how training moves it."""
    rows = [r for r in rows if r.get("response_lens")]
    if not rows:
        return False
    k = max(1, len(rows) // 4)
    early = [n for r in rows[:k] for n in r["response_lens"]]
    late = [n for r in rows[-k:] for n in r["response_lens"]]
    top = max(early + late)
    bins = list(range(0, top + 2, max(1, (top + 1) // 40)))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.hist(early, bins=bins, alpha=0.6, label=f"iterations 1-{k}", color="tab:blue")
    ax.hist(late, bins=bins, alpha=0.6, label=f"iterations {len(rows) - k + 1}-{len(rows)}", color="tab:orange")
    ax.set_yscale("log")
    ax.set_xlabel("output length (tokens)")
    ax.set_ylabel("samples")
    ax.set_title("Output-length distribution")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save_figure(fig, path)
    return True


def plot_run_signals(rows: list[dict], path: Path) -> bool:
    """The run's own length estimates (``generation.dispatch.run_signals``) as the run goes: recall@20%
    of group makespans over the recent closed groups at each iteration, against a random ranking's 0.2."""
    key = "run_signals_recall_at_20"
    pts = [(r["iteration"], r[key]) for r in rows if r.get(key) is not None]
    if not pts:
        return False
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.plot([i for i, _ in pts], [x for _, x in pts], marker="o", ms=3, label="run's own estimates")
    ax.axhline(0.2, color="grey", lw=0.8, ls="--", label="random ranking")
    ax.set_ylim(0, 1)
    ax.set_xlabel("iteration")
    ax.set_ylabel("recall@20% of group makespans")
    ax.set_title("Length estimates from the run itself (recent closed groups)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save_figure(fig, path)
    return True


def _run_signals_lines(rows: list[dict]) -> list[str]:
    recall = [r["run_signals_recall_at_20"] for r in rows if r.get("run_signals_recall_at_20") is not None]
    if not recall:
        return []
    last = rows[-1]
    return [f"| run's own length estimates: recall@20% of group makespans, first / last scored iteration (random: "
            f"0.2) | {recall[0]:.2f} / {recall[-1]:.2f} ({last.get('run_signals_revisits', 0)} groups placed on a "
            f"revisit; spread sigma {last.get('run_signals_sigma', float('nan')):.2f}) |"]


def _bounded_lines(rows: list[dict]) -> list[str]:
    if not any("bound_violations" in r for r in rows):
        return []
    last = rows[-1]
    aborted = ", ".join(f"{k[len('aborted_'):]} {v}" for k, v in last.items() if k.startswith("aborted_")) or "none"
    if "trajectories" in last:  # an agentic run: its own lines (``_agentic_lines``)
        return [f"| staleness bound eta / violations | {last['eta']} / {sum(r['bound_violations'] for r in rows)} |"]
    return [
        f"| staleness bound eta / violations | {last['eta']} / {sum(r['bound_violations'] for r in rows)} |",
        f"| inherent staleness (Laminar M - K), mean | {_mean(rows, 'inherent_staleness_mean'):.2f} |",
        f"| weight syncs / interrupted samples / resumed | {last.get('syncs', 0)} / {last.get('interrupted', 0)} / "
        f"{last.get('resumed', 0)} |",
        f"| aborted groups | {aborted}; filtered (dynamic sampling) {last.get('filtered', 0)} |",
    ]


def _agentic_lines(rows: list[dict], run_dir: Path) -> list[str]:
    """An agentic run's trajectories: turns, tokens, time per stage, failures, one transcript."""
    if not rows or "trajectories" not in rows[-1]:
        return []
    last = rows[-1]
    groups_aborted = ", ".join(f"{k[len('groups_aborted_'):]} {v}" for k, v in last.items()
                               if k.startswith("groups_aborted_")) or "none"
    dropped = ", ".join(f"{k[len('dropped_'):]} {v}" for k, v in last.items()
                        if k.startswith("dropped_") and k != "dropped_tokens"
                        and not k.startswith("dropped_on_env_")) or "none"
    lines = [
        "", "## Agentic trajectories", "",
        "| metric | value |", "|---|---|",
        f"| interaction | {last['interaction']} |",
        f"| turns per trajectory: mean / max | {_mean(rows, 'turns_mean'):.2f} / {max(r['turns_max'] for r in rows)} |",
        f"| generated / observation tokens per trajectory | {_mean(rows, 'generated_tokens_mean'):.1f} / "
        f"{_mean(rows, 'observation_tokens_mean'):.1f} |",
        f"| per turn: generation / environment step (latency injected) | "
        f"{1000 * _mean(rows, 'gen_turn_s_mean'):.1f} ms / "
        f"{1000 * _mean(rows, 'env_step_s_mean'):.1f} ms ({1000 * _mean(rows, 'env_latency_s_mean'):.1f} ms) |",
        f"| reward per trajectory (scoring time) | {1000 * _mean(rows, 'reward_s_mean'):.1f} ms |",
        f"| weight versions spanned by one trajectory, max | {max(r['version_span_max'] for r in rows)} |",
        f"| trajectories launched / finished / dropped / aborted | {last.get('trajectories_launched', 0)} / "
        f"{last.get('trajectories_finished', 0)} / {last.get('trajectories_dropped', 0)} / "
        f"{last.get('trajectories_aborted', 0)} |",
        f"| dropped by cause; replaced | {dropped}; {last.get('replacements', 0)} |",
        f"| aborted groups | {groups_aborted} |",
        f"| generated tokens thrown away (aborted / dropped) | {last.get('aborted_tokens', 0)} / "
        f"{last.get('dropped_tokens', 0)} |",
    ]
    return lines + _transcript(run_dir / "trajectories.jsonl")


def _transcript(path: Path) -> list[str]:
    """The last trained trajectory that earned a reward (else the last one), turn by turn."""
    if not path.exists():
        return []
    records = [json.loads(x) for x in path.read_text().splitlines()[-200:] if x.strip()]
    if not records:
        return []
    rec = next((r for r in reversed(records) if r["reward"] > 0), records[-1])
    out = ["", f"A trained trajectory (step {rec['step']}, {rec['env']} episode {rec['seed']}, "
           f"reward {rec['reward']:g}):", "",
           "| turn | action (generated) | observation |", "|---|---|---|", f"| prompt | | `{rec['prompt']}` |"]
    out += [f"| {i} | `{t['action']}` | `{t['observation']}` |" for i, t in enumerate(rec["turns"])]
    return out


def _mean(rows: list[dict], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows) if rows else 0.0


def _breakdown_header(summary: dict) -> list[str]:
    """The count-down task breaks accuracy down by scratchpad steps; a dataset by its group field."""
    group = summary.get("breakdown", "steps")
    title = "difficulty (scratchpad steps)" if group == "steps" else f"`{group}`"
    return [f"## Accuracy by {title}", "", f"| {group} | prompts | warm start | final |", "|---|---|---|---|"]


def render_markdown(rows: list[dict], summary: dict, run_dir: Path = Path(".")) -> str:
    ws, fin = summary["eval_warmstart"], summary["eval_final"]
    wall = sum(r["iteration_time_s"] for r in rows)
    lines = [
        f"# Braid run report — mode `{summary['mode']}`" + (" — EMULATED" if "emulated" in summary else ""),
        "",
        *_emulated_lines(summary),
        *banner(summary),
        "| metric | value |",
        "|---|---|",
        f"| held-out prompts | {summary['eval_prompts']} (fingerprint `{summary['eval_fingerprint']}`) |",
        f"| warm-start accuracy | {summary['warmstart_accuracy']:.3f} ± {summary['warmstart_stderr']:.3f} |",
        f"| final accuracy | {summary['final_accuracy']:.3f} ± {summary['accuracy_stderr']:.3f} |",
        f"| improvement | {summary['improvement']:+.3f} ({summary['improvement_in_stderr']:.1f} × final s.e.) |",
        *([f"| final model | `{summary['final_checkpoint']}` |"] if summary.get("final_checkpoint") else []),
        f"| iterations | {summary['iterations']} |",
        *([f"| reward failures (counted 0, not correct; `reward-failures.jsonl`) | {summary['reward_failures']} |"]
          if summary.get("reward_failures") else []),
        f"| samples/s (RL phase) | {summary['samples_per_second']:.1f} |",
        f"| mean generation / training time per iteration | {_mean(rows, 'gen_time_s'):.2f} s / "
        f"{_mean(rows, 'train_time_s'):.2f} s |",
        f"| idle fraction: generation / training | {sum(r['idle_gen_s'] for r in rows) / wall:.2f} / "
        f"{sum(r['idle_train_s'] for r in rows) / wall:.2f} |",
        f"| staleness (versions): mean / max | {_mean(rows, 'staleness_mean'):.2f} / "
        f"{max((r['staleness_max'] for r in rows), default=0)} |",
        f"| trainer stall per weight push | {1000 * _mean(rows, 'push_stall_s'):.1f} ms |",
        *_bounded_lines(rows),
        *_run_signals_lines(rows),
        *_agentic_lines(rows, run_dir),
        "",
        "![learning curve](learning_curve.png)",
        "",
        "![stage timeline](timeline.png)",
        "",
        *(["![output-length distribution](lengths.png)", ""] if any(r.get("response_lens") for r in rows) else []),
        *(["![staleness per buffer](staleness.png)", ""] if any("entry_staleness_hist" in r for r in rows) else []),
        *(["![run's own length estimates](run_signals.png)", ""] if _run_signals_lines(rows) else []),
        *_breakdown_header(summary),
    ]
    for name, final in fin["by_difficulty"].items():
        before = ws["by_difficulty"].get(name, {}).get("accuracy", float("nan"))
        lines.append(f"| {name} | {final['n']} | {before:.3f} | {final['accuracy']:.3f} |")
    lines += [
        "",
        "Accuracy is one sample per prompt at the training temperature (pass@1); the standard error is",
        "binomial, sqrt(p(1-p)/n).",
        *suite_lines(rows, summary),
        *report_lines(run_dir, rows),
        *final_lines(summary),
        "",
    ]
    return "\n".join(lines)


def _emulated_lines(summary: dict) -> list[str]:
    """An EMULATED run's banner: what was modelled, at what time scale, and its modelled figures;
    every wall-clock figure below is the emulation's, never a measurement of a GPU."""
    emu = summary.get("emulated")
    if emu is None:
        return []
    tm = emu["time_model"]
    return [
        f"**EMULATED** (time scale {emu['time_scale']:g}): no model computed. The SGS instances waited out a latency "
        f"profile's step times and the learner the allocator's predicted steps of {tm['model']} on "
        f"{tm['gpus']} x {tm['gpu']} ({tm['parallel']}, {tm['source']}); tokens are synthetic and the accuracy is the "
        "declared reward rate. Wall-clock figures below are the emulation's; modelled ones = wall / time scale.",
        "",
        f"Modelled: {emu['modelled_samples_per_second']:.2f} samples/s, {emu['modelled_rl_seconds']:.1f} s of RL, "
        f"{emu['predicted_step_s_mean']:.2f} s per training step (predicted).",
        "",
        *_control_plane_lines(summary),
    ]


def _control_plane_lines(summary: dict) -> list[str]:
    """The control plane's measured cost beside an EMULATED run's figures, and its flag."""
    cp, cpu = summary.get("control_plane"), summary.get("process_cpu")
    if cp is None or cpu is None:
        return []
    loop = cp["orchestrator_busy_mean"]
    looped = (f"; orchestrator loop busy {loop:.0%} of wall time on average (max {cp['orchestrator_busy_max']:.0%})"
              if loop is not None else "")
    line = (f"Control plane (measured on this machine): {cpu['cpu_s']:.1f} CPU-s over every process, "
            f"{cpu['cpu_s_per_sample'] * 1000:.1f} CPU-ms per trained sample, {cpu['cores_busy']:.2f} of "
            f"{cpu['cores']} cores busy{looped}.")
    flag = (["", f"**FLAGGED**: the control plane may have set this run's pace ({'; '.join(cp['why'])}): its modelled "
             "figures are a lower bound on the fleet's."] if cp["flagged"] else [])
    return [line, *flag, ""]


def final_lines(summary: dict) -> list[str]:
    """Where the trained model is and how to load and score it (``services.run.final``)."""
    final = summary.get("final_checkpoint")
    if not final:
        return []
    adapter = summary.get("final_adapter")
    config = str(Path(final).parent / "config.json")
    return [
        "", "## The trained model", "",
        f"`{final}`: the policy the final evaluation scored, a Hugging Face checkpoint (weights, tokenizer, "
        "chat template when the model has one; `final.json` holds its iteration, weight version and held-out accuracy)"
        + (f", the LoRA adapter folded into its base; the adapter itself is `{adapter}`." if adapter else "."),
        "", "```",
        f'AutoModelForCausalLM.from_pretrained("{final}")   # transformers; vLLM: LLM(model="{final}")',
        f"braid eval --model {final} --config {config}",
        "```",
    ]


def write_report(run_dir: Path) -> Path:
    rows, timeline, summary = _load(run_dir)
    plot_learning(rows, summary, run_dir / "learning_curve.png")
    plot_timeline(timeline, run_dir / "timeline.png",
                  time_scale=summary["emulated"]["time_scale"] if "emulated" in summary else None)
    plot_staleness(rows, run_dir / "staleness.png")
    plot_lengths(rows, run_dir / "lengths.png")
    plot_run_signals(rows, run_dir / "run_signals.png")
    plot_suites(rows, summary, run_dir / "suites.png")
    path = run_dir / "report.md"
    path.write_text(render_markdown(rows, summary, run_dir))
    return path
