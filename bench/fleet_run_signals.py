"""EMULATED: dispatch on a real multi-visit trace with the run's own length estimates (issue 55).

Every run here is EMULATED (``deploy/configs/emulated.yaml``, as ``bench/fleet_dispatch.py``: the
real launcher, 32 SGS gRPC services, the rollout orchestrator, relays and reward pool; each instance
waits out the step times of an H20 serving Qwen2.5-7B, the learner the predicted steps of
Qwen2.5-7B on 8 H800). Every time is a prediction in modelled seconds, never beside measured ones.

**Workload.** The real multi-visit trace (``bench/run_signals_trace.py``: SmolLM2-135M-Instruct
answering 64 GSM8K questions 8 times a visit over 3 visits while it trained) replayed sample by
sample (``forced_length_replay.file`` *.jsonl.gz, ``VisitReplay``): the run's task is a dataset of
the trace's prompt texts, every step draws all of them (one visit a step: ``prompts_per_iteration``
= the trace's questions, ``iterations`` = its visits), and the k-th draw of a question replays its
k-th recorded visit, one length per sample, so each question's lengths move from visit to visit as
the recorded policy's did. Lengths are SmolLM2's tokens as recorded (cap 1,024), not rescaled.

**Variants** (one run each per round):

- length-blind (``bench/fleet_dispatch.LENGTH_BLIND``): ``pick``, ``round_robin``,
  ``least_loaded``, ``least_tokens``;
- ``alg2+lpt+text``: StreamRL's design (Algorithm 2 placement, LPT admission) on the text ranker
  alone: each question's estimate is a LightGBM ranker's, cross-fitted over 4 folds by question on
  the other questions' first-visit lengths (``bench/run_signals_eval.cross_fitted``: no question's
  own lengths reach its estimate), written beside each group of the replayed trace;
- ``alg2+lpt+run_signals``: the same, with ``generation.dispatch.run_signals`` on: that text
  estimate as the prior, the question's history in this run and the group's finished siblings
  (``services.generation.scheduling.run_signals``);
- ``alg2+lpt+oracle``: the draw's true mean length.

**Regime** (declared before the run of record): ``bench/fleet_dispatch``'s (32 instances,
``max_inflight`` 8: one group of 8 running per instance, time scale 0.25), sync training, 64 groups
of 8 a step (two waves over 32 instances: which groups go in the first wave is what an estimate
decides), 3 iterations = 3 visits. The first step (visit 0: no history yet) is left out of the
metric, as in every fleet benchmark, so the metric covers visits 1 and 2.

**Metric of record**: a step's generation makespan (modelled s, mean of the steady steps); ratio =
best length-blind makespan / the variant's per round, median of ``ROUNDS`` interleaved rounds
(round r: the dataset's draw order seeded with r, the variants rotated left by r) with the range.
**Target** (``TARGETS``): ``run_signals_vs_best_length_blind`` >= 1.20; the text ranker's and the
oracle's ratios beside it. The run's own recall of the estimator (``run_signals_recall_at_20``, the
step metric) is reported per run.

Writes ``dispatch.run_signals`` into ``bench/results/fleet.json`` (its own provenance; the rest of
``dispatch`` is ``bench/fleet_dispatch.py``'s), ``fleet_run_signals.md`` and ``fleet_run_signals.png``.
Duration: 7 variants x 3 rounds = 21 runs of ~45-60 s, ~20 minutes.

    python bench/fleet_run_signals.py [--trace bench/traces/gsm8k_smollm2_visits.jsonl.gz] [--quick]
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import fleet_dispatch as fd  # noqa: E402
from bench.report_io import (  # noqa: E402
    RecordParser,
    provenance,
    provenance_line,
    results_dir,
    round_order,
    set_fleet_subpart,
    shown_path,
)

TRACE = ROOT / "bench/traces/gsm8k_smollm2_visits.jsonl.gz"
ROUNDS, TIME_SCALE, INSTANCES = fd.ROUNDS, fd.TIME_SCALE, fd.INSTANCES
PRIOR = {"kind": "lightgbm", "folds": 4, "seed": 0}
HELD_OUT = [f"Held-out question {k}: what is {k} plus {k}?" for k in range(8)]  # eval only: not in the trace
ALG2_LPT = ["generation.dispatch.policy=streamrl", "generation.admission=lpt"]
ESTIMATED = {
    "alg2+lpt+text": [*ALG2_LPT, "forced_length_replay.estimates=recorded"],
    "alg2+lpt+run_signals": [*ALG2_LPT, "forced_length_replay.estimates=recorded",
                             "generation.dispatch.run_signals.enabled=true"],
    "alg2+lpt+oracle": [*ALG2_LPT, "forced_length_replay.estimates=oracle"],
}
VARIANTS = {**fd.LENGTH_BLIND, **ESTIMATED}
HEADLINES = {"run_signals_vs_best_length_blind": "alg2+lpt+run_signals", "text_vs_best_length_blind": "alg2+lpt+text",
             "oracle_vs_best_length_blind": "alg2+lpt+oracle"}
TARGETS = {"run_signals_vs_best_length_blind": (">=", 1.20)}
QUICK = {"instances": 4, "rounds": 1}


# ------------------------------------------------------------------ the workload (pure but for files)
def workload(trace: list[dict], priors: dict[str, float], work: Path) -> dict:
    """The run's dataset (the trace's prompt texts, and a few held-out ones for its evaluation) and
    the replayed trace with each group's text estimate beside it; what the regime follows from it."""
    prompts = sorted({g["prompt"] for g in trace})
    work.mkdir(parents=True, exist_ok=True)
    train, heldout, replay = work / "prompts.jsonl", work / "heldout.jsonl", work / "replay.jsonl.gz"
    train.write_text("".join(json.dumps({"question": p, "answer": "0"}) + "\n" for p in prompts))
    heldout.write_text("".join(json.dumps({"question": q, "answer": str(2 * k)}) + "\n"
                               for k, q in enumerate(HELD_OUT)))
    with gzip.open(replay, "wt") as fh:
        fh.writelines(json.dumps({**g, "estimate": round(priors[g["prompt"]], 3)}) + "\n" for g in trace)
    sizes = {len(g["lengths"]) for g in trace}
    if len(sizes) != 1:
        raise SystemExit(f"the trace's groups differ in size ({sorted(sizes)}): one group size a run")
    return {"train": train, "heldout": heldout, "replay": replay, "prompts": len(prompts),
            "visits": 1 + max(g["visit"] for g in trace), "group_size": sizes.pop(),
            "cap": max(n for g in trace for n in g["lengths"])}


def overrides(w: dict, variant: str, round_: int, instances: int, time_scale: float, run_dir: Path) -> list[str]:
    return [*[x for x in fd.BASE if not x.startswith(("trainer.group_size", "eval.prompts"))],
            "trainer.mode=sync", f"trainer.group_size={w['group_size']}", f"eval.prompts={len(HELD_OUT)}",
            "task.kind=dataset", f"task.dataset.train={w['train']}", f"task.dataset.heldout={w['heldout']}",
            "task.dataset.prompt_field=question", "task.dataset.answer_field=answer", "task.dataset.name=trace",
            f"task.seed={round_}", f"generation.instances={instances}", f"trainer.iterations={w['visits']}",
            f"trainer.prompts_per_iteration={w['prompts']}", f"generation.emulation.time_scale={time_scale}",
            f"forced_length_replay.file={w['replay']}", f"runs_dir={run_dir.parent}",
            f"cache_dir={ROOT / '.cache'}", *VARIANTS[variant]]


def own_recall(run_dir: Path) -> float | None:
    """The run's own recall@20% of its estimator over the steady steps (the step metric; None when off)."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    xs = [r["run_signals_recall_at_20"] for r in rows[1:] if r.get("run_signals_recall_at_20") is not None]
    return statistics.fmean(xs) if xs else None


def run_all(ns, w: dict, variants: list[str]) -> tuple[dict[str, list[dict]], list[str]]:
    from bench.fleet import run_config

    runs: dict[str, list[dict]] = {v: [] for v in variants}
    order = [f"{v}#{r}" for r in range(ns.rounds) for v in round_order(variants, r)]
    t0 = time.time()
    for k, item in enumerate(order):
        variant, r = item.rsplit("#", 1)
        eta = "" if k == 0 else f", ~{(time.time() - t0) / k * (len(order) - k) / 60:.0f} min left"
        print(f"[{k + 1}/{len(order)}] round {r}: {variant} ({time.time() - t0:.0f} s elapsed{eta})", flush=True)
        run_dir = Path(ns.work) / f"{variant}-r{r}"
        run_config(fd.CONFIG, run_dir,
                   lambda _f, v=variant, rr=int(r), d=run_dir: overrides(w, v, rr, ns.instances, ns.time_scale, d))
        runs[variant].append({**fd.measure_run(run_dir, variant, simulate=False), "own_recall": own_recall(run_dir)})
    return runs, order


# ------------------------------------------------------------------ judging and the report
def headline(block: dict) -> dict:
    out = {}
    for key, variant in HEADLINES.items():
        if variant in block["variants"]:
            out[key] = {**block["variants"][variant]["vs_best_length_blind"], "variant": variant,
                        "best_length_blind": block["best_length_blind"]}
    return out


def verdicts(head: dict) -> dict:
    out = {}
    for key, (op, bound) in TARGETS.items():
        value = (head.get(key) or {}).get("median")
        out[key] = {"value": value, "target": f"{op} {bound}", "met": None if value is None else value >= bound}
    return out


def markdown(res: dict) -> str:
    s, t = res["settings"], res["trace"]
    lines = ["# EMULATED: dispatch on a real multi-visit trace, the run's own estimates (bench/fleet_run_signals.py)",
             "", f"EMULATED ({s['instances']} instances of H20 serving Qwen2.5-7B, time scale {s['time_scale']:g}, "
             f"max_inflight {fd.MAX_INFLIGHT}, sync, {s['rounds']} interleaved rounds): every time is a prediction in "
             f"modelled seconds. Trace `{t['file']}`: {t['prompts']} questions x {t['group_size']} samples x "
             f"{t['visits']} visits (one visit a step; the first step, with no history, left out of the metric).", ""]
    for key, v in res["verdicts"].items():
        shown = "not measured" if v["value"] is None else f"{v['value']:.3f}"
        met = {None: "n/a", True: "met", False: "**missed**"}[v["met"]]
        lines.append(f"- `{key}`: {shown} (target {v['target']}: {met})")
    for key in ("text_vs_best_length_blind", "oracle_vs_best_length_blind"):
        if key in res:
            lines.append(f"- `{key}`: {res[key]['median']:.3f} [{res[key]['min']:.3f}-{res[key]['max']:.3f}]")
    lines += ["", "| variant | makespan s | vs best blind | trained tokens/s | own recall@20% (steady steps) |",
              "|---|---|---|---|---|"]
    for v, x in res["block"]["variants"].items():
        g, r = x["gen_span_s"], x["vs_best_length_blind"]
        rec = [q["own_recall"] for q in res["runs"][v] if q["own_recall"] is not None]
        flag = " (spread >= effect)" if r["spread_as_large_as_effect"] else ""
        lines.append(f"| {v} | {g['median']:.2f} [{g['min']:.2f}-{g['max']:.2f}] | {r['median']:.3f} "
                     f"[{r['min']:.3f}-{r['max']:.3f}]{flag} | {x['tokens_per_s']['median']:.0f} | "
                     f"{f'{statistics.median(rec):.2f}' if rec else '-'} |")
    lines += ["", f"Best length-blind: `{res['block']['best_length_blind']}`.", "",
              provenance_line(res["provenance"]), ""]
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res["block"]["variants"])
    r = [res["block"]["variants"][v]["vs_best_length_blind"] for v in names]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar(names, [x["median"] for x in r], yerr=[[x["median"] - x["min"] for x in r],
                                                  [x["max"] - x["median"] for x in r]], capsize=3,
           color=["grey" if v in fd.LENGTH_BLIND else "tab:blue" for v in names])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(TARGETS["run_signals_vs_best_length_blind"][1], color="tab:red", lw=0.8, ls="--", label="target")
    ax.set_ylim(bottom=max(0.0, min(0.9, min(x["min"] for x in r) - 0.05)))
    ax.set_ylabel("best length-blind makespan / variant's")
    ax.set_title("EMULATED: dispatch on the SmolLM2 GSM8K multi-visit trace (median and range of rounds)")
    ax.tick_params(axis="x", labelsize=8, rotation=20)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = RecordParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ", ".join(VARIANTS))
    ap.add_argument("--instances", type=int, default=INSTANCES)
    ap.add_argument("--time-scale", type=float, default=TIME_SCALE)
    ap.add_argument("--quick", action="store_true", help="4 instances, 1 round; scratch output (a smoke run)")
    ap.add_argument("--work", default=str(ROOT / "bench/runs/fleet_run_signals"))
    ap.add_argument("--out", default=None, help="default bench/results (--quick: /tmp/braid-bench-quick)")
    ns = ap.parse_args(argv)
    if ns.quick:
        ns.instances, ns.rounds, ns.work = QUICK["instances"], QUICK["rounds"], str(Path(ns.work) / "quick")
    variants = [v.strip() for v in ns.variants.split(",") if v.strip()]
    if [v for v in variants if v not in VARIANTS] or not any(v in fd.LENGTH_BLIND for v in variants):
        ap.error(f"--variants: a subset of {list(VARIANTS)} with at least one length-blind variant")
    if ns.rounds < 1:
        ap.error("--rounds must be >= 1")
    trace_path = Path(ns.trace)
    if not trace_path.is_file():
        raise SystemExit(f"bench/fleet_run_signals.py: no trace at {trace_path} (bench/run_signals_trace.py)")

    from bench.run_signals_eval import complete_visits, cross_fitted, load

    trace = complete_visits(load(trace_path))  # one whole visit a step
    w = workload(trace, cross_fitted(trace, PRIOR["kind"], PRIOR["folds"], PRIOR["seed"]), Path(ns.work))
    settings = {"instances": ns.instances, "rounds": ns.rounds, "time_scale": ns.time_scale, "variants": variants,
                "quick": ns.quick, "prior": PRIOR, "prompts_per_iteration": w["prompts"], "iterations": w["visits"]}
    declared = {"settings": settings, "base": fd.BASE, "variants": {v: VARIANTS[v] for v in variants},
                "targets": TARGETS}
    prov = provenance(Path(__file__), declared, fd.CONFIG, engine="emulated", inputs=[trace_path])
    t0 = time.time()
    runs, order = run_all(ns, w, variants)
    block = fd.summarize_block(runs)
    head = headline(block)
    result = {"label": "EMULATED", **head, "verdicts": verdicts(head),
              "targets": {k: f"{op} {b}" for k, (op, b) in TARGETS.items()}, "block": block, "runs": runs,
              "order": order, "settings": settings, "bench_wall_s": round(time.time() - t0, 1),
              "trace": {"file": shown_path(trace_path), "prompts": w["prompts"], "visits": w["visits"],
                        "group_size": w["group_size"], "cap": w["cap"]},
              "provenance": prov}
    out = results_dir(ns.out, ns.quick)
    out.mkdir(parents=True, exist_ok=True)
    written = set_fleet_subpart(out / "fleet.json", "dispatch", "run_signals", result)
    text = markdown(result)
    (written.parent / "fleet_run_signals.md").write_text(text)
    plot(result, written.parent / "fleet_run_signals.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
