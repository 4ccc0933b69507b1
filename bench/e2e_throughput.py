"""Throughput of Braid's pipeline modes, interleaved: the ratios of record of ``bench/e2e.py``
measured as the median of several ABAB rounds with their spread (issue 19 item 5).

``bench/e2e.py`` runs each mode once (it scores checkpoints, ~6 min a mode) and reports its
samples/s; one run of a mode spreads ±5-20% from the next here (the policy's response lengths and
the long tail differ between runs), as large as the effects it compares. This script runs the
same modes with the same settings (config, iterations, checkpoints, held-out prompts, instances,
pinning: ``e2e.py``'s full preset) throughput-only, in ``--rounds`` rounds. Round ``r`` runs every
mode once with sampling seed ``r`` (the same seed for every mode of a round, so a round is a
paired comparison), in the order of the modes rotated by ``r`` (each mode takes each position in
turn, so drift in the machine's speed over the hour does not land on one mode).

Per async mode and round: samples/s and completion tokens/s over sync's of the same round; the
ratio of record is the median over rounds with its range, flagged ``spread_as_large_as_effect``
when the range is at least the effect |median - 1|. Staleness bound violations are counted in
every run and must be 0.

Writes ``bench/results/e2e_throughput.json``/``.md``/``.png`` and sets ``throughput_interleaved``
in ``bench/results/e2e.json`` (``--quick``: all under ``/tmp/braid-bench-quick``).

``--iterations`` and ``--eval-prompts`` shorten a record when the machine is slow: the ratios are
of steady iterations (the first left out), and each run's own evaluations before and after its
timed steps are outside them. The record of 2026-11-30 (declared before its run) used
``--iterations 50 --eval-prompts 200``: that morning this machine ran sync at 7.0-7.8 s an
iteration, at e0a3a96's code as at the new one (a 15-step look each), against 3.5 s when e0a3a96's
record ran (2026-11-28), so the four modes x 3 rounds at the full preset would have taken ~2 h.

    python bench/e2e_throughput.py [--rounds 3] [--modes sync,one_step,bounded_2] [--quick]
                                   [--iterations N] [--eval-prompts N]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from e2e import FULL, QUICK, measure_repeat, run_mode  # noqa: E402
from e2e_core import mode_overrides, pin_overrides, repeat_overrides, warmstart_overrides  # noqa: E402

from bench.report_io import (  # noqa: E402
    RecordParser,
    flagged_ratio,
    provenance,
    results_dir,
    round_order,
    set_json_key,
    spread,
    write_results,
)

MODES = ("sync", "one_step", "bounded_1", "bounded_2", "bounded_4", "bounded_2_partial")
BASELINE = "sync"
# the comparisons of record: (numerator, denominator) -> the factor the target asks for (None: no target)
TARGETS = {("one_step", "sync"): 1.25, ("bounded_2", "one_step"): 1.0}
# pairs reported beside them, with no target: StaleFlow's coordination at the same bound (issue 54 item 2)
BESIDE = (("bounded_2_staleflow", "one_step"), ("bounded_2_staleflow", "bounded_2"))


# ---------------------------------------------------------------------------------------- policy
def comparisons(modes: list[str]) -> list[tuple[str, str]]:
    """Every mode against sync, plus the target pairs and those beside them whose modes both ran."""
    pairs = [(m, BASELINE) for m in modes if m != BASELINE]
    return pairs + [p for p in (*TARGETS, *BESIDE) if p not in pairs and set(p) <= set(modes)]


def summarize(modes: list[str], runs: dict[str, list[dict]]) -> dict:
    """Per mode the spread of samples/s and tokens/s; per comparison the per-round ratios (flagged);
    the targets judged on the medians; staleness violations added up over every run."""
    per_mode = {m: {k: spread([r[k] for r in runs[m]]) for k in ("samples_per_s", "tokens_per_s")} for m in modes}
    ratios = {}
    for a, b in comparisons(modes):
        ratios[f"{a}/{b}"] = {k: flagged_ratio([r[k] for r in runs[a]], [r[k] for r in runs[b]])
                              for k in ("samples_per_s", "tokens_per_s")}
    targets = {f"{a}/{b} >= {f:g}x": ratios[f"{a}/{b}"]["samples_per_s"]["median"] >= f
               for (a, b), f in TARGETS.items() if f"{a}/{b}" in ratios}
    return {"modes": per_mode, "ratios": ratios, "targets": targets,
            "staleness_violations": sum(r["staleness"]["violations"] for m in modes for r in runs[m])}


# ---------------------------------------------------------------------------------------- rendering
def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [
        "# Braid pipeline modes: throughput, interleaved rounds (`bench/e2e_throughput.py`)",
        "",
        f"{s['rounds']} rounds; round r runs every mode once (sampling seed r, order rotated by r), "
        f"{s['iterations']} optimizer steps each, {s['instances']} SGS instances, engine "
        f"`{result['provenance']['engine']}`, pinned: {s['pinned']}. Throughput-only: no checkpoint is scored "
        "(accuracy and convergence: `e2e.md`). Samples/s over the iterations after the first.",
        "",
        "| mode | samples/s median [min–max] | tokens/s median [min–max] |",
        "|---|---|---|",
    ]
    for m, v in result["modes"].items():
        a, t = v["samples_per_s"], v["tokens_per_s"]
        lines.append(f"| {m} | {a['median']:.1f} [{a['min']:.1f}–{a['max']:.1f}] | "
                     f"{t['median']:.0f} [{t['min']:.0f}–{t['max']:.0f}] |")
    lines += ["", "Ratios per round (same seed, same round), median [range]; *spread as large as the effect* "
              "means these rounds do not resolve the comparison:", "",
              "| ratio | samples/s | tokens/s | per round (samples/s) |", "|---|---|---|---|"]
    for name, v in result["ratios"].items():
        cells = []
        for k in ("samples_per_s", "tokens_per_s"):
            r = v[k]
            flag = " *spread as large as the effect*" if r["spread_as_large_as_effect"] else ""
            cells.append(f"**{r['median']:.2f}x** [{r['min']:.2f}–{r['max']:.2f}]{flag}")
        per = ", ".join(f"{x:.2f}" for x in v["samples_per_s"]["per_repeat"])
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | {per} |")
    lines += ["", "Targets (on the median samples/s ratio): "
              + ", ".join(f"{k}: **{'met' if ok else 'missed'}**" for k, ok in result["targets"].items()),
              "", f"Staleness bound violations over all runs: **{result['staleness_violations']}**.", "",
              "Run order: " + " · ".join(result["order"]), "",
              f"Provenance: commit `{result['provenance']['commit'][:12]}`"
              f"{' (dirty tree)' if result['provenance']['dirty'] else ''}, {result['provenance']['date']}, "
              f"{result['provenance']['machine']['cpu']} ({result['provenance']['machine']['cores']} cores).", ""]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["ratios"])
    fig, ax = plt.subplots(figsize=(1.4 * len(names) + 3, 4.5))
    for i, name in enumerate(names):
        for k, dx, color in (("samples_per_s", -0.12, "tab:blue"), ("tokens_per_s", 0.12, "tab:orange")):
            r = result["ratios"][name][k]
            ax.scatter([i + dx] * len(r["per_repeat"]), r["per_repeat"], color=color, s=18, alpha=0.6)
            ax.hlines(r["median"], i + dx - 0.1, i + dx + 0.1, color=color, lw=2.5,
                      label=(k.replace("_per_s", "/s") + " (rounds, median)") if i == 0 else None)
    ax.axhline(1.0, color="grey", ls=":")
    ax.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
    ax.set_ylabel("ratio, same round")
    ax.set_title(f"Throughput ratios over {result['settings']['rounds']} interleaved rounds")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def e2e_entry(result: dict) -> dict:
    """What ``bench/results/e2e.json`` keeps under ``throughput_interleaved``."""
    keep = ("settings", "modes", "ratios", "targets", "staleness_violations", "provenance")
    return {**{k: result[k] for k in keep}, "source": "bench/e2e_throughput.py"}


# ---------------------------------------------------------------------------------------- mechanism
class RoundFailed(RuntimeError):
    """A run of an interleaved round failed (its error is in the run directory's e2e_mode.json)."""


def run_rounds(names: list[str], rounds: int, config_for, checkpoint: str, work: Path, mode_of=lambda name: name,
               keep=("samples_per_s", "tokens_per_s", "staleness", "started_at", "run_dir")) -> tuple[dict, list[str]]:
    """``rounds`` interleaved rounds of throughput-only Braid runs: round r runs every variant in
    ``names`` once, in ``round_order(names, r)``, with ``config_for(name, r)`` (e2e's
    ``measure_repeat``: samples/s, tokens/s, staleness against the bound of e2e mode
    ``mode_of(name)``). Returns the runs per variant and the order."""
    runs: dict[str, list[dict]] = {n: [] for n in names}
    order = [f"{n}#{r}" for r in range(rounds) for n in round_order(names, r)]
    t_start = time.time()
    for r in range(rounds):
        for name in round_order(names, r):
            run_dir = work / f"{name}~r{r}"
            cfg = config_for(name, r)
            done = sum(len(v) for v in runs.values())
            print(f"[{done + 1}/{len(order)}] round {r}: {name} ({time.time() - t_start:.0f}s elapsed)", flush=True)
            rep = run_mode(name, run_dir, cfg, {"config": cfg.model_dump(mode="json")}, False,
                           functools.partial(measure_repeat, mode_of(name), run_dir, cfg, checkpoint))
            if rep["status"] != "ok":
                raise RoundFailed(f"{name} round {r} failed: {rep['status']}")
            runs[name].append({k: rep[k] for k in keep})
    return runs, order


def main() -> int:
    parser = RecordParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "deploy/configs/default.yaml"))
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated; must include sync")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (>= 3 for a ratio of record)")
    parser.add_argument("--quick", action="store_true", help=f"e2e's quick preset ({QUICK['iterations']} steps)")
    parser.add_argument("--iterations", type=int, default=None,
                        help=f"optimizer steps per run (default: the preset's, full {FULL['iterations']})")
    parser.add_argument("--eval-prompts", type=int, default=None,
                        help="held-out prompts of each run's own evaluations before and after its timed steps "
                             "(default: the preset's, as e2e's scored runs); not in the throughput measured")
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=len(os.sched_getaffinity(0)) >= 2)
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench-e2e-throughput"))
    parser.add_argument("--out", default=None, help="default bench/results (--quick: /tmp/braid-bench-quick)")
    ns = parser.parse_args()
    modes = [m.strip() for m in ns.modes.split(",") if m.strip()]
    if BASELINE not in modes or len(modes) < 2:
        parser.error(f"--modes must include {BASELINE} and at least one other mode")
    for m in modes:
        mode_overrides(m, ns.instances)  # validates the name
    if ns.rounds < 1:
        parser.error("--rounds must be >= 1")
    if (ns.iterations is not None and ns.iterations < 3) or (ns.eval_prompts is not None and ns.eval_prompts < 1):
        parser.error("--iterations must be >= 3 (the first is left out) and --eval-prompts >= 1")

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from services.common.config import load_config
    from services.policy.warmstart import ensure_warmstart

    preset = QUICK if ns.quick else FULL
    # e2e.py's settings exactly (its warm start included), so these runs repeat its scored runs' workload
    ws_over = warmstart_overrides(preset["warmstart_steps"])
    base_cfg = load_config(ns.config, ws_over)
    checkpoint = str(ensure_warmstart(base_cfg).resolve())
    iterations = ns.iterations or preset["iterations"]
    eval_prompts = ns.eval_prompts or max(preset["eval_prompts"], preset["paired_prompts"])
    base = [*ws_over, f"trainer.iterations={iterations}", f"trainer.checkpoint_every={preset['checkpoint_every']}",
            f"eval.prompts={eval_prompts}"]
    work = Path(ns.work) / ("quick" if ns.quick else "full")
    t_start = time.time()

    def config_for(mode: str, r: int):
        return load_config(ns.config, base + mode_overrides(mode, ns.instances) + pin_overrides(ns.pin)
                           + repeat_overrides(r))

    try:
        runs, order = run_rounds(modes, ns.rounds, config_for, checkpoint, work)
    except RoundFailed as err:
        print(f"{err}; no ratio of record from this run", file=sys.stderr)
        return 1
    result = {
        **summarize(modes, runs),
        "runs": runs,
        "order": order,
        "settings": {"rounds": ns.rounds, "modes": modes, "iterations": iterations, "eval_prompts": eval_prompts,
                     "quick": ns.quick, "instances": ns.instances, "pinned": ns.pin, "overrides": base,
                     "config": ns.config},
        "bench_wall_s": time.time() - t_start,
        "provenance": provenance(Path(__file__), {"config": base_cfg.model_dump(mode="json"), "overrides": base,
                                                  "modes": modes, "rounds": ns.rounds},
                                 Path(ns.config).resolve(), base_cfg.generation.engine),
    }
    out = results_dir(ns.out, ns.quick)
    print(write_results(out, "e2e_throughput", result, markdown, plot))
    set_json_key(out / "e2e.json", "throughput_interleaved", e2e_entry(result))
    print(f"set throughput_interleaved in {out / 'e2e.json'}; total {time.time() - t_start:.0f}s")
    return 1 if result["staleness_violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
