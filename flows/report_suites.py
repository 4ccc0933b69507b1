"""The run report's evaluation suites (``services.run.evaluations``): one curve per suite, a table, the flags.

Every point comes from the run's own files: the warm start and the end from ``summary.json``
(``suites``: each suite's ``before`` and ``after``), the evaluations between steps from the
``metrics.jsonl`` rows that carry ``suite_accuracy``/``suite_stderr`` (at the row's weight
version). A suite the forgetting check flagged (``forgetting``; ``forgetting_between_steps``)
is named at the top of the report and marked on its curve. A summary written before suites
existed has no ``suites``: nothing is drawn.
"""

from __future__ import annotations

from pathlib import Path

from flows.plots import plt, save_figure
from services.run.forgetting import flag_line


def suite_points(rows: list[dict], summary: dict) -> dict[str, list[tuple[int, float, float]]]:
    """Per suite, (weight version, accuracy, standard error) in version order."""
    points: dict[str, list[tuple[int, float, float]]] = {}
    for name, s in (summary.get("suites") or {}).items():
        points[name] = [(s["before"]["weight_version"], s["before"]["accuracy"], s["before"]["stderr"])]
    for row in rows:
        for name, acc in (row.get("suite_accuracy") or {}).items():
            points.setdefault(name, []).append((row["weight_version"], acc, row["suite_stderr"][name]))
    for name, s in (summary.get("suites") or {}).items():
        points[name].append((s["after"]["weight_version"], s["after"]["accuracy"], s["after"]["stderr"]))
    return points


def shown(rows: list[dict], summary: dict) -> bool:
    """Whether the report has a suites section: suites besides the held-out split, or evaluations between steps."""
    return len(summary.get("suites") or {}) > 1 or any("suite_accuracy" in r for r in rows)


def plot_suites(rows: list[dict], summary: dict, path: Path) -> bool:
    """One curve per suite over the weight version, ±1 s.e.; flagged evaluations marked."""
    if not shown(rows, summary):
        return False
    flagged = {(f["suite"], f["weight_version"]) for f in all_flags(summary)}
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, pts in suite_points(rows, summary).items():
        xs, ys, es = zip(*pts, strict=True)
        line = ax.errorbar(xs, ys, yerr=es, marker="o", ms=4, capsize=3, label=name)
        bad = [(x, y) for x, y, _ in pts if (name, x) in flagged]
        if bad:
            ax.plot(*zip(*bad, strict=True), "x", color="red", ms=11, mew=2.5)
            line.set_label(f"{name} (FORGETTING)")
    ax.set_xlabel("weight version (0 = warm start)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title("Evaluation suites (±1 s.e.; red x: flagged by the forgetting check)")
    save_figure(fig, path)
    return True


def all_flags(summary: dict) -> list[dict]:
    """The flags between steps, then those of the final evaluation."""
    return [*(summary.get("forgetting_between_steps") or []), *(summary.get("forgetting") or [])]


def banner(summary: dict) -> list[str]:
    """The top of the report: each flag (the final evaluation's, then those between steps at other
    versions), and an early stop."""
    final = summary.get("forgetting") or []
    seen = {(f["suite"], f["weight_version"]) for f in final}
    between = [f for f in summary.get("forgetting_between_steps") or []
               if (f["suite"], f["weight_version"]) not in seen]
    flags = [*final, *between]
    lines = [f"**{flag_line(f)}** (final evaluation)" for f in final]
    lines += [f"**{flag_line(f)}** (between steps)" for f in between]
    stop = summary.get("stopped_early")
    if stop:
        lines.append(f"**The run stopped after the step to weight version {stop['weight_version']}** "
                     f"({stop['reason']}: {', '.join(stop['suites'])}).")
    if flags:
        lines.append(f"(Flagged: accuracy below the warm start's by more than "
                     f"{summary.get('forgetting_threshold_se', 3.0):g} standard errors of the difference.)")
    return [x for line in lines for x in (line, "")]


def suite_lines(rows: list[dict], summary: dict) -> list[str]:
    """The suites section: per suite its settings, warm-start and final accuracy, the change, its flag."""
    if not shown(rows, summary):
        return []
    final_flags = {f["suite"] for f in summary.get("forgetting") or []}
    midrun = {f["suite"] for f in summary.get("forgetting_between_steps") or []}
    lines = ["", "## Evaluation suites", "",
             "The held-out split first; every suite at the warm start, at the end, and every `every` steps "
             f"between (on the SGS, between optimizer steps: {summary.get('suite_eval_seconds', 0.0):.1f} s in all, "
             "outside the RL time).", "", "![evaluation suites](suites.png)", "",
             "| suite | prompts | temperature | every | warm start | final | change | forgetting |",
             "|---|---|---|---|---|---|---|---|"]
    for name, s in (summary.get("suites") or {}).items():
        b, a = s["before"], s["after"]
        se = (b["stderr"] ** 2 + a["stderr"] ** 2) ** 0.5
        change = a["accuracy"] - b["accuracy"]
        flag = "**flagged**" if name in final_flags else ("flagged between steps" if name in midrun else "-")
        temp = s.get("temperature")
        lines.append(f"| {name} | {b['prompts']} | {'greedy' if temp == 0 else temp} | {s.get('every', 0) or '-'} "
                     f"| {b['accuracy']:.3f} ± {b['stderr']:.3f} | {a['accuracy']:.3f} ± {a['stderr']:.3f} "
                     f"| {change:+.3f} ({change / se if se else 0.0:+.1f} s.e.) | {flag} |")
    return lines
