"""Dynamic scale-out at fleet scale, EMULATED (issue 54 item 4; StreamRL §4.2, Figure 11).

The emulated stack (``deploy/configs/emulated.yaml``: the real launcher, SGS services and cores,
SGS router, orchestrator, relays and reward pool; instances of an H20 serving Qwen2.5-7B whose
step times come from the derived profile and are waited out; the emulated learner's H800 steps)
runs one_step pipelining with a growing-length ramp, twice per round: once with the scale-out
controller (``scaleout.enabled``: ``allocator/scaleout.py`` decides, ``flows/scaleout.py`` adds
instances from the pool and the router takes them in), once without (the baseline: the same run,
the same seed, ``N0`` instances throughout). Every time is a prediction (EMULATED).

Declared before the run of record (2026-11-30):

- **lengths**: the trainer's ``forced_length_ramp`` (``generation.forced_lengths``: EOS ignored,
  iteration k generates exactly ``RAMP_START + k * RAMP_STEP`` tokens, ``bench/scaleout.py``'s
  definition): output lengths that grow with the iterations as in StreamRL's Figure 11, the same in
  both runs. Round r uses ``generation.seed=r`` (the emulated reward's draws, the prompts' order);
- **fleet**: ``N0`` = 4 instances (``--instances``), 32 prompts x 8 samples per step (the config's):
  64 sequences per instance, the config's ``max_inflight``, so each H20 decodes at batch 64, past its
  compute knee (the profile's ``k2 / k3``, about 30 sequences): there, and only there, a data-parallel
  unit more shortens generation (below the knee a step costs the same at any batch, and an added
  instance saves nothing: a 256-sample step over 8 or more instances is that regime). Declared after
  a quick look (2026-11-30, load average above 40 on the shared machine, not a result): 8 instances
  x 512 samples was CPU-bound on this machine's 2 cores (the stack's measured cost, about 20 CPU-ms
  per sample, exceeded the cores), so the emulation no longer followed the profile;
- **controller**: pool up to ``POOL`` x N0 (``scaleout.max_instances``; the emulated engine's
  processes serve the pool as standby instances, and an added one waits out
  ``scaleout.emulated_start_s`` (30 modelled s: a cold start) before it joins the router),
  ``scaleout.max_step`` = N0 (a decision adds up to N0 instances: StreamRL's rule applied to its
  own prediction, ``allocator.scaleout.units_to_add``), window 1, cooldown 1, no scale-in;
- **time scale** 1.0 (modelled seconds pass as wall seconds): the control plane's own per-iteration
  cost stays a small share of a step;
- **metric of record** ``gain_vs_baseline``: per round, the controller run's trained tokens per
  second (samples x forced length / iteration time) over the *after* iterations divided by the
  baseline's over the same iterations. *After*: from the first iteration the controller read with
  added instances serving (its ``scaleout.jsonl`` decision row has more than N0 instances) to the
  end. Beside it: ``final_window`` (the same ratio over the last ``FINAL`` iterations), ``before``
  (the same ratio over the iterations before ``after``: no added instance served them in either
  run, so it should be near 1: the comparison's control; it includes iteration 0 and so the
  start-up, the same in both runs), each
  run's throughput before and after, per-iteration delta = T_gen - T_train
  (``bench.scaleout.per_iteration``), the events (iteration, instances) and the control plane's
  measured share (``bench.fleet_async.judge_run``: the orchestrator's busy fraction, CPU-ms per
  sample of all processes);
- **what the quick look showed about the regime** (2026-11-30, not a result): under this profile
  T_gen is about 3 x T_train from the first iteration (both grow linearly with the forced length:
  the H20's per-token step barely grows with context for a GQA 7B model), so the controller's first
  decision comes after the first window (iteration 0) and it keeps adding as delta grows in
  seconds with the ramp, as in Figure 11; the run does not start balanced;
- **rounds**: ``--rounds`` (>= 3), round r runs the two in an order rotated by r;
- **target** (issue 54): median ``gain_vs_baseline`` >= ``TARGET`` (1.3), with the spread.

Writes ``scaleout`` into ``bench/results/fleet.json`` (other keys kept), ``fleet_scaleout.md`` and
``fleet_scaleout.png`` (delta per iteration, both runs, events marked). Expected duration of the
record: 3 rounds of 2 runs, about 11-14 minutes (one round at these settings took 4 min 34 s at a
load average of 3-7 on the shared 2-core machine: the controller run 115 s, the baseline 142 s).

    python bench/fleet_scaleout.py [--rounds 3] [--instances 4] [--iterations 12] [--time-scale 1.0] [--quick]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.fleet import run_config  # noqa: E402
from bench.fleet_async import judge_run  # noqa: E402
from bench.report_io import (  # noqa: E402
    RecordParser,
    provenance,
    provenance_line,
    results_dir,
    round_order,
    set_fleet_part,
    spread,
)
from bench.scaleout import per_iteration  # noqa: E402

CONFIG = ROOT / "deploy/configs/emulated.yaml"
RUNS = ROOT / "bench/runs/fleet_scaleout"
TARGET = 1.3
FINAL = 3  # iterations in the final window
POOL = 3  # the pool: up to POOL x N0 instances
RAMP_START, RAMP_STEP = 64, 32  # forced length of iteration k: RAMP_START + k * RAMP_STEP tokens
VARIANTS = ("scaleout", "baseline")
PROMPTS, GROUP = 32, 16  # per step: 512 sequences, 128 per instance at N0 = 4, in 32 Generate calls
WARM_START_S = 0.0  # modelled start of a pooled instance: warm standby (its weights still cross the real relays)
CONTROLLER = ["scaleout.enabled=true", "scaleout.window=1", "scaleout.cooldown=1", "scaleout.scale_in=false",
              f"scaleout.emulated_start_s={WARM_START_S}"]


def overrides(name: str, r: int, ns) -> list[str]:
    """One run's overrides: the same for both variants but the controller."""
    out = [f"generation.instances={ns.instances}", f"generation.emulation.time_scale={ns.time_scale}",
           f"trainer.iterations={ns.iterations}", f"generation.seed={r}", "trainer.mode=one_step",
           f"trainer.prompts_per_iteration={PROMPTS}", f"trainer.group_size={GROUP}",
           "generation.forced_lengths=true", f"forced_length_ramp.start={RAMP_START}",
           f"forced_length_ramp.per_iteration={RAMP_STEP}", "generation.dispatch.router=on", "eval.prompts=8"]
    if name == "scaleout":
        out += [*CONTROLLER, f"scaleout.max_instances={POOL * ns.instances}", f"scaleout.max_step={ns.instances}"]
    return out


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def events_of(run_dir: Path, n0: int) -> dict:
    """The controller's record: scale-out events (decision iteration, instances after it) and the
    first iteration it read with added instances serving (None: none joined)."""
    rows = _jsonl(run_dir / "scaleout.jsonl")
    outs = [{"iteration": e["iteration"], "instances": e["instances"], "start_s": e.get("start_s"),
             "join_s": e.get("join_s")} for e in rows if e["event"] == "scale_out"]
    served = [e["iteration"] for e in rows if e["event"] == "decision" and e["instances"] > n0]
    first_out = min((e["iteration"] for e in rows if e["event"] == "decision" and e["action"] == "out"), default=None)
    return {"events": outs, "first_decision": first_out, "first_served": min(served, default=None),
            "instances_final": max((e["instances"] for e in outs), default=n0)}


def rate(rows: list[dict], its: list[int], scale: float) -> float | None:
    """Trained tokens per modelled second (samples x forced length / iteration time, x ``scale``, the
    time scale) over iterations ``its``."""
    by = {r["iteration"]: r for r in rows}
    its = [k for k in its if k in by]
    wall = sum(by[k]["iteration_time_s"] for k in its)
    return sum(by[k]["samples"] * by[k]["response_len_mean"] for k in its) * scale / wall if its and wall > 0 else None


def judge_round(scaled: Path, baseline: Path, ns) -> dict:
    """One round: the windows, their ratios, per-iteration deltas, events and control-plane cost."""
    from flows.artifacts import read_metrics

    rows = {"scaleout": read_metrics(scaled / "metrics.jsonl"), "baseline": read_metrics(baseline / "metrics.jsonl")}
    ev = events_of(scaled, ns.instances)
    its = [r["iteration"] for r in rows["scaleout"]]
    after = [k for k in its if ev["first_served"] is not None and k >= ev["first_served"]]
    first = ev["first_served"] if ev["first_served"] is not None else len(its)
    windows = {"before": [k for k in its if k < first], "after": after, "final": its[-FINAL:]}
    rates = {w: {v: rate(rows[v], k, ns.time_scale) for v in VARIANTS} for w, k in windows.items()}
    ratio = {w: (r["scaleout"] / r["baseline"] if r["scaleout"] and r["baseline"] else None) for w, r in rates.items()}
    return {"gain_vs_baseline": ratio["after"], "final_window": ratio["final"], "before": ratio["before"],
            "windows": windows, "tokens_per_s": rates, **ev,
            "per_iteration": {"scaleout": per_iteration(scaled), "baseline": per_iteration(baseline)},
            "runs": {"scaleout": judge_run(scaled, ns.time_scale), "baseline": judge_run(baseline, ns.time_scale)}}


def summarize(rounds: list[dict], ns, prov: dict) -> dict:
    def over(key: str) -> dict | None:
        xs = [r[key] for r in rounds if r[key] is not None]
        return {**spread(xs), "per_round": [r[key] for r in rounds]} if xs else None

    head = over("gain_vs_baseline")
    passed = head is not None and len(head["per_round"]) == len(rounds) and None not in head["per_round"] \
        and head["median"] >= TARGET
    return {"label": "EMULATED", "instances": ns.instances, "pool": POOL * ns.instances, "max_step": ns.instances,
            "time_scale": ns.time_scale, "iterations": ns.iterations, "rounds": ns.rounds,
            "final_window_iterations": FINAL, "ramp": f"{RAMP_START} + {RAMP_STEP} x iteration tokens (forced)",
            "target": TARGET, "passed": passed, "gain_vs_baseline": head, "final_window": over("final_window"),
            "before": over("before"),
            "metric": "trained tokens/s of the controller run over the iterations from the first one read with added "
                      "instances serving to the end / the baseline's (controller off) over the same iterations",
            "per_round": rounds, "provenance": prov}


def markdown(res: dict) -> str:
    g, f, b = res["gain_vs_baseline"], res["final_window"], res["before"]
    show = lambda s: f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})" if s else "n/a"  # noqa: E731
    lines = ["# EMULATED dynamic scale-out at fleet scale (StreamRL Fig. 11)", "",
             f"**gain_vs_baseline {show(g)}** (target median >= {res['target']:.2f}: "
             f"{'met' if res['passed'] else '**missed**'}); final {res['final_window_iterations']} iterations "
             f"{show(f)}; before any added instance served {show(b)} (control: about 1). {res['instances']} emulated "
             f"H20 instances (Qwen2.5-7B) at the start, pool up to {res['pool']}, ramp {res['ramp']}, "
             f"{res['iterations']} iterations, time scale {res['time_scale']:g}, {res['rounds']} rounds. "
             "EMULATED: every figure is a prediction.", "",
             "| round | events (iteration: instances) | after from | tokens/s after (controller / baseline) | gain | "
             "final window | before | orchestrator busy max (ctl / base) | CPU-ms / sample (ctl / base) |",
             "|---|---|---|---|---|---|---|---|---|"]
    num = lambda x, p=2: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    for i, r in enumerate(res["per_round"]):
        ev = ", ".join(f"{e['iteration']}: {e['instances']}" for e in r["events"]) or "none"
        tp, runs = r["tokens_per_s"]["after"], r["runs"]
        busy = [num(runs[v]["orchestrator_busy_max"]) for v in VARIANTS]
        lines.append(f"| {i} | {ev} | {r['first_served']} | {num(tp['scaleout'], 0)} / {num(tp['baseline'], 0)} | "
                     f"{num(r['gain_vs_baseline'])} | {num(r['final_window'])} | {num(r['before'])} | "
                     f"{busy[0]} / {busy[1]} | {num(runs['scaleout']['cpu_ms_per_sample'], 1)} / "
                     f"{num(runs['baseline']['cpu_ms_per_sample'], 1)} |")
    return "\n".join([*lines, "", f"Metric: {res['metric']}.", "", provenance_line(res["provenance"]), ""])


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = res["per_round"]
    fig, axes = plt.subplots(1, len(rounds), figsize=(4.5 * len(rounds), 3.6), squeeze=False, sharey=True)
    for ax, (i, r) in zip(axes[0], enumerate(rounds), strict=True):
        for name, style in (("scaleout", "o-"), ("baseline", "s--")):
            rows = r["per_iteration"][name]
            ax.plot([x["iteration"] for x in rows], [x["delta_s"] for x in rows], style, ms=3,
                    label=f"delta, {'controller on' if name == 'scaleout' else 'baseline'}")
        for k, e in enumerate(sorted({e["iteration"] for e in r["events"]})):
            n = max(x["instances"] for x in r["events"] if x["iteration"] == e)
            ax.axvline(e, color="tab:red", alpha=0.6, label="scale-out decision" if k == 0 else None)
            ax.annotate(f"{n}", (e, 0), color="tab:red", fontsize=8)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_title(f"round {i}: gain {r['gain_vs_baseline'] or float('nan'):.2f}x", fontsize=9)
        ax.set_xlabel("iteration (forced length grows)")
    axes[0][0].set_ylabel("T_gen - T_train (s)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"EMULATED: {res['instances']} H20 instances, pool to {res['pool']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = RecordParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", type=int, default=4, help="N0: instances at the start")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--quick", action="store_true", help="1 round of 8 iterations, scratch output")
    ap.add_argument("--out", default=None)
    ns = ap.parse_args()
    if ns.quick:
        ns.rounds, ns.iterations = 1, 8
    prov = provenance(Path(__file__), {k: getattr(ns, k) for k in ("instances", "rounds", "iterations", "time_scale")},
                      CONFIG, engine="emulated")
    rounds = []
    for r in range(ns.rounds):
        dirs = {name: run_config(CONFIG, RUNS / f"r{r}-{name}", lambda _f, name=name, r=r: overrides(name, r, ns))
                for name in round_order(list(VARIANTS), r)}
        rounds.append(judge_round(dirs["scaleout"], dirs["baseline"], ns))
        print(f"round {r}: gain {rounds[-1]['gain_vs_baseline']}, final {rounds[-1]['final_window']}, "
              f"before {rounds[-1]['before']}, events {rounds[-1]['events']}", flush=True)
    res = summarize(rounds, ns, prov)
    out = results_dir(ns.out, ns.quick)
    out.mkdir(parents=True, exist_ok=True)
    set_fleet_part(out / "fleet.json", "scaleout", res)
    (out / "fleet_scaleout.md").write_text(markdown(res))
    plot(res, out / "fleet_scaleout.png")
    print(markdown(res))


if __name__ == "__main__":
    main()
