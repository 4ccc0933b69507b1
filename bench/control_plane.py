"""The control plane's own ceiling (issue 53 item 7): EMULATED one_step runs at 16, 64 and 256 instances.

Every process is real (the launcher, the SGS services and their cores, the orchestrator, the
relay, the reward pool); only the accelerators are emulated (``deploy/configs/emulated.yaml``: H20
instances of Qwen2.5-7B, H800 training). Each instance count ``N`` runs ``prompts_per_iteration = N``
groups of 8 (one group per instance per step), every sample exactly ``LENGTH`` tokens (forced-length
replay of one length: a long tail would make the step's longest group grow with N, which is the
fleet's effect, not the control plane's), with ``max(8, N)`` H800 training (the predicted step
stays below the generation's at every N), at ``--time-scale``: the modelled fleet asks the control
plane for N x 8 samples per modelled step, and either it keeps up or it becomes the bottleneck.

Declared before the run of record, per instance count:

- ``samples_per_s``: samples trained per second of wall time between the first iteration's end and
  the last's (the steady state: the first iteration's start-up left out);
- ``efficiency``: weak scaling: ``samples_per_s`` per instance against the smallest count's (each
  instance brings the same work and the same modelled accelerator, so a control plane that keeps up
  holds it near 1); the control plane **saturates** at the smallest count where it falls below
  ``KEEPS_UP`` (0.9) or the orchestrator loop is busy >= ``BUSY`` (0.8) of an iteration;
- ``cpu_ms_per_sample``: every process's CPU between the first and the last iteration's end per
  sample trained in between (``process_cpu.steady``: no start-up, evaluation or shut-down), and the
  orchestrator loop's alone (the rollout thread's CPU in its ticks);
- ``trainer_max_rss_mb``, the largest process's RSS (``ru_maxrss`` of the launcher's children);
- correctness at every count: ``staleness_max`` <= eta (1) and the ledger consumed every step's
  groups exactly once (``check_ledger``): 0 staleness violations, 0 lost samples.

Beside them, each step's emulated generation span against the launch-path simulator's
(``allocator.launch_sim``, each instance its own accelerator), for reading; not judged here
(``bench/fleet.py`` judges it in sync mode).

EMULATED: times are predictions; the CPU and memory figures are measured on this machine.
Writes ``control_plane`` into ``bench/results/emulation.json`` (the rest is kept) and
``control_plane.md``.

    python bench/control_plane.py [--instances 16,64,256] [--iterations 4] [--time-scale 1.0]
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.dispatch_train_sim import simulate_run_launched, step_spans  # noqa: E402
from bench.fleet import CONFIG, run_emulated  # noqa: E402
from bench.report_io import RecordParser, provenance, provenance_line, results_dir, set_json_key  # noqa: E402

RUNS = ROOT / "bench/runs/control_plane"
KEEPS_UP = 0.9
BUSY = 0.8
TIME_SCALE = 1.0  # declared: a modelled H20 step (~25 ms) takes its own time; the fleet should set the pace
LENGTH = 1000  # tokens every sample generates: a modelled step of ~7 s, long beside the control plane's latencies


def overrides(n: int, ns, lengths_file: Path) -> list[str]:
    return ["trainer.mode=one_step", "generation.forced_lengths=true", f"generation.instances={n}",
            f"trainer.prompts_per_iteration={n}", f"trainer.micro_batch_groups={min(8, n)}",
            f"trainer.iterations={ns.iterations}",
            f"generation.emulation.time_scale={ns.time_scale}", f"forced_length_replay.file={lengths_file}",
            f"trainer.emulation.gpus={max(8, n)}", "eval.prompts=8", f"runs_dir={RUNS}", f"cache_dir={ROOT / '.cache'}"]


def run_count(n: int, ns, lengths: list[int]) -> Path:
    return run_emulated(RUNS / f"n{n}", lengths, lambda f: overrides(n, ns, f))


def judge_count(n: int, run_dir: Path) -> dict:
    """One instance count's figures (see the module docstring)."""
    from services.common.config import load_config
    from services.generation.emulated_engine import resolve_profile
    from services.run.ledger import check_ledger

    cfg = load_config(run_dir / "config.json")
    tc, scale = cfg.trainer, cfg.generation.emulation.time_scale
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    profile = resolve_profile(cfg.generation.emulation.profile)
    gen = simulate_run_launched(run_dir, cfg.generation.dispatch.policy, profile, cores=None)
    per_step = tc.prompts_per_iteration * tc.group_size
    steady = summary["process_cpu"]["steady"] or {}
    ledger = check_ledger(run_dir / "ledger.jsonl", tc.iterations, tc.prompts_per_iteration)
    busy = [r["orchestrator_busy"] for r in rows]
    cpu = summary["process_cpu"]
    return {
        "instances": n, "samples_per_step": per_step, "samples_per_s": steady_rate(rows),
        "samples_per_s_rl_phase": summary["samples_per_second"],
        "emulated_gen_span_s": [s / scale for s in step_spans(run_dir)], "simulated_gen_span_s": gen,
        "predicted_train_step_s": summary["emulated"]["predicted_step_s_mean"],
        "cpu_ms_per_sample": 1000 * steady["cpu_s_per_sample"] if steady else None,
        "cores_busy": steady.get("cores_busy"), "cpu_ms_per_sample_with_startup": 1000 * cpu["cpu_s_per_sample"],
        "busiest_process": next(iter((steady.get("by_process") or {}).items()), None),
        "orchestrator_cpu_ms_per_sample": 1000 * sum(r["orchestrator_cpu_s"] for r in rows) / max(1, sum(
            r["samples"] for r in rows)),
        "orchestrator_busy_mean": statistics.fmean(busy), "orchestrator_busy_max": max(busy),
        "orchestrator_tick_cpu_ms_max": max(r["orchestrator_tick_cpu_ms_max"] for r in rows),
        "trainer_max_rss_mb": summary["trainer_max_rss_mb"],
        "staleness_max": max(r["staleness_max"] for r in rows),
        "staleness_violations": sum(1 for r in rows if r["staleness_max"] > 1),
        "lost_samples": per_step * tc.iterations - ledger.consumed_samples + len(ledger.duplicate_samples),
        "ledger_ok": not (ledger.missing_steps or ledger.duplicate_samples or ledger.wrong_group_counts),
        "control_plane_flag": summary.get("control_plane"), "run_dir": str(run_dir),
    }


def steady_rate(rows: list[dict]) -> float:
    """Samples per second between the first iteration's end and the last's."""
    return sum(r["samples"] for r in rows[1:]) / (rows[-1]["t_end"] - rows[0]["t_end"])


def add_efficiency(counts: list[dict]) -> None:
    """Weak-scaling efficiency of each count against the smallest (samples/s per instance)."""
    base = counts[0]["samples_per_s"] / counts[0]["instances"]
    for c in counts:
        c["efficiency"] = c["samples_per_s"] / c["instances"] / base


def saturation(counts: list[dict]) -> int | None:
    """The smallest instance count at which the control plane set the pace (None: it kept up)."""
    for c in counts:
        if c["efficiency"] < KEEPS_UP or c["orchestrator_busy_max"] >= BUSY:
            return c["instances"]
    return None


def markdown(res: dict) -> str:
    sat = res["saturates_at_instances"]
    lines = [
        "# The control plane's ceiling (EMULATED fleet, measured control plane)", "",
        f"Time scale {res['time_scale']:g}; one group of 8 per instance per step; one_step. The control plane "
        + (f"**saturates at {sat} instances**" if sat else "**kept up at every count**")
        + f" (weak-scaling efficiency < {KEEPS_UP:.0%} or orchestrator loop busy >= {BUSY:.0%}).", "",
        "| instances | samples/s | efficiency | CPU-ms/sample (all / loop) | cores busy | busiest process (cores) "
        "| loop busy mean / max | trainer RSS MB | largest RSS MB | staleness max | lost |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in res["counts"]:
        all_cpu = f"{c['cpu_ms_per_sample']:.1f}" if c["cpu_ms_per_sample"] is not None else "-"
        busy = f"{c['cores_busy']:.2f}" if c["cores_busy"] is not None else "-"
        top = f"{c['busiest_process'][0]} ({c['busiest_process'][1]:.2f})" if c["busiest_process"] else "-"
        lines.append(
            f"| {c['instances']} | {c['samples_per_s']:.1f} | {c['efficiency']:.2f} "
            f"| {all_cpu} / {c['orchestrator_cpu_ms_per_sample']:.2f} | {busy} | {top} | "
            f"{c['orchestrator_busy_mean']:.0%} / {c['orchestrator_busy_max']:.0%} | {c['trainer_max_rss_mb']:.0f} | "
            f"{c['largest_rss_mb']:.0f} | {c['staleness_max']} | {c['lost_samples']} |")
    return "\n".join([*lines, "", provenance_line(res["provenance"]), ""])


def main() -> None:
    ap = RecordParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", default="16,64,256")
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--time-scale", type=float, default=TIME_SCALE)
    ap.add_argument("--quick", action="store_true", help="4 and 8 instances, 3 iterations, scratch output")
    ap.add_argument("--out", default=None)
    ns = ap.parse_args()
    counts_wanted = [4, 8] if ns.quick else [int(x) for x in ns.instances.split(",")]
    if ns.quick:
        ns.iterations = 3
    prov = provenance(Path(__file__), {"instances": counts_wanted, "iterations": ns.iterations,
                                       "time_scale": ns.time_scale, "length": LENGTH}, CONFIG, engine="emulated")
    lengths = [LENGTH]
    counts = []
    for n in counts_wanted:
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        c = judge_count(n, run_count(n, ns, lengths))
        c["largest_rss_mb"] = max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
        counts.append(c)
        print(f"{n}: {c['samples_per_s']:.1f} samples/s, loop busy max {c['orchestrator_busy_max']:.0%}, "
              f"steady CPU-ms/sample {c['cpu_ms_per_sample']}", flush=True)
    add_efficiency(counts)
    res = {"label": "EMULATED", "time_scale": ns.time_scale, "iterations": ns.iterations, "counts": counts,
           "saturates_at_instances": saturation(counts), "keeps_up_threshold": KEEPS_UP, "busy_threshold": BUSY,
           "provenance": prov}
    out = results_dir(ns.out, ns.quick)
    out.mkdir(parents=True, exist_ok=True)
    set_json_key(out / "emulation.json", "control_plane", res)
    (out / "control_plane.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
