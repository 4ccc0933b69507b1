"""The chaos suite (`make chaos`): real runs with components killed and the network faulted.

Each scenario is one real run (tiny model built from ``--config``'s model section, the hf engine
for a bounded time, real SGS / relay / router / trainer processes on loopback) with faults
injected once it has taken two steps (``bench/chaos_run.py``):

- **kill -9**, one at a time: an SGS instance (in every mode's configuration), a weight relay, the
  master relay, the router, the trainer process (the rollout orchestrator runs inside it: killing
  it rolls back to the checkpoint), the learner process alone (between two checkpoints: it must
  cost no trajectory); and in pairs, at the same moment;
- **network faults** on the trainer's link to SGS instance 0 through a fault-injecting proxy:
  delay with jitter for the whole run, a 3 s partition (held bytes, then healed), a reset of
  every connection.

``bounded`` runs use 3 SGS instances, 2 relays (relay transport) and the repack coordinator;
``routed`` runs put the router in front of 2 instances (one-step asynchrony). Every run must
finish with every sample consumed exactly once (the ledger), no staleness violation and
byte-identical weights on every live relay and instance; recovery time is the time from the
fault to the next finished training step. Then (``--repeat``) the test of a lost SGS instance
runs N times in a row beside a CPU load of one busy process per core.

Writes ``chaos.json`` / ``chaos.md`` / ``chaos.png`` (``bench/results``, or ``--out``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.chaos_run import RunResult, Scenario, run_scenario
from bench.report_io import ROOT, RecordParser, provenance, provenance_line, results_dir, write_results

SCENARIOS = [
    Scenario("kill_sgs", "bounded", ("sgs",)),
    # an instance killed while deltas flow comes back through a whole version (weights.delta, no shared memory)
    Scenario("kill_sgs_delta", "bounded_delta", ("sgs",)),
    Scenario("kill_relay", "bounded", ("relay",)),
    Scenario("kill_master_relay", "bounded", ("master_relay",)),
    Scenario("kill_trainer", "bounded", ("trainer",)),
    Scenario("kill_router", "routed", ("router",)),
    Scenario("kill_trainer_routed", "routed", ("trainer",)),
    Scenario("kill_sgs+relay", "bounded", ("sgs", "relay")),
    Scenario("kill_sgs+trainer", "bounded", ("sgs", "trainer")),
    Scenario("kill_relay+trainer", "bounded", ("relay", "trainer")),
    Scenario("kill_master_relay+trainer", "bounded", ("master_relay", "trainer")),
    Scenario("kill_router+trainer", "routed", ("router", "trainer")),
    # the learner process alone, between two recovery checkpoints: the orchestrator loses nothing
    Scenario("kill_learner", "bounded", ("learner",)),
    Scenario("kill_learner_routed", "routed", ("learner",)),
    Scenario("kill_learner_sync", "sync", ("learner",)),
    Scenario("kill_learner_agentic", "agentic", ("learner",)),
    Scenario("kill_sgs+learner", "bounded", ("sgs", "learner")),
    # a lost SGS instance comes back in every mode
    Scenario("kill_sgs_routed", "routed", ("sgs",)),
    Scenario("kill_sgs_sequential", "sequential", ("sgs",)),
    Scenario("kill_sgs_sync", "sync", ("sgs",)),
    Scenario("kill_sgs_one_step", "one_step", ("sgs",)),
    Scenario("kill_sgs_agentic", "agentic", ("sgs",)),
    Scenario("net_delay", "bounded", fault="delay"),
    Scenario("net_partition", "bounded", fault="partition"),
    Scenario("net_reset", "bounded", fault="reset"),
]
FLAKY_TEST = "tests/integration/test_bounded.py::test_a_lost_instance_loses_no_trajectory"


def summarize(results: list[RunResult]) -> dict:
    """The suite's totals (pure): faults per kind, runs completed, samples lost, duplicates,
    violations, weights mismatches, and recovery time per component (single kills) and per pair."""
    faults: dict[str, int] = {}
    recovery: dict[str, list[float]] = {}
    for r in results:
        for f in r.faults:
            faults[f] = faults.get(f, 0) + 1
        kills = [f.split(":", 1)[1] for f in r.faults if f.startswith("kill:")]
        nets = [f.split(":", 1)[1] for f in r.faults if f.startswith("net:")]
        key = "+".join(kills) if kills else (f"net_{nets[0]}" if nets else "")
        if key and r.recovery_s is not None:
            recovery.setdefault(key, []).append(r.recovery_s)
    return {
        "faults_injected": faults,
        "faults_total": sum(faults.values()),
        "runs": len(results),
        "runs_completed": sum(r.completed for r in results),
        "samples_lost": sum(r.samples_lost for r in results),
        "duplicates": sum(r.duplicates for r in results),
        "violations": sum(r.violations for r in results),
        "weights_mismatches": sum(1 for r in results if r.completed and not r.weights.get("ok")),
        # every run's ledger: each sample consumed exactly once, no step missing, split or out of order
        "ledger_ok": bool(results) and all(r.ledger.get("ok") for r in results),
        "ledger_failures": [r.scenario for r in results if not r.ledger.get("ok")],
        # each kill of the trainer process landed between two recovery checkpoints and rolled back steps
        # (None: no run killed it)
        "rollback_exercised": (all(r.rolled_back_groups > 0 for r in trainer)
                               if (trainer := [r for r in results if _killed(r, "trainer")]) else None),
        "rolled_back_groups": {r.scenario: r.rolled_back_groups for r in results if _killed(r, "trainer")},
        "recovery_s": {k: {"median": statistics.median(v), "max": max(v), "n": len(v)}
                       for k, v in sorted(recovery.items())},
        **trajectory_totals(results),
    }


def _killed(r: RunResult, component: str) -> bool:
    return f"kill:{component}" in r.faults


def trajectory_totals(results: list[RunResult]) -> dict:
    """What the kills cost in trajectories (pure). The trainer is the learner process: killed alone
    (``kill:learner``) it must cost none. Killing the whole trainer process (the orchestrator with
    it) rolls back to the newest checkpoint: counted apart. Per scenario config, the SGS instances
    back in service after a kill of one (every mode must have one)."""
    learner = [r for r in results if _killed(r, "learner") and not _killed(r, "trainer")]
    readmitted: dict[str, int] = {}
    for r in results:
        if _killed(r, "sgs"):
            readmitted[r.config] = readmitted.get(r.config, 0) + r.instances_readmitted
    return {
        "trajectories_lost_on_trainer_kill": sum(r.trajectories_lost for r in learner),
        "learner_kills": [{"scenario": r.scenario, "trajectories_lost": r.trajectories_lost,
                           "revivals": r.learner_revivals} for r in learner],
        "trajectories_lost_on_trainer_process_kill": sum(r.trajectories_lost for r in results if _killed(r, "trainer")),
        "instances_readmitted": readmitted,
    }


def passed(summary: dict) -> bool:
    flaky = summary.get("flaky_test")
    return (summary["runs_completed"] == summary["runs"] and not summary["samples_lost"] and not summary["duplicates"]
            and summary.get("ledger_ok", False) and summary.get("rollback_exercised") is not False
            and not summary["violations"] and not summary["weights_mismatches"]
            and not summary.get("trajectories_lost_on_trainer_kill")
            and all(summary.get("instances_readmitted", {}).values())
            and all(k["revivals"] and k["revivals"][0]["replayed_steps"] for k in summary.get("learner_kills", []))
            and (flaky is None or flaky["passed"] == flaky["runs"]))


def repeat_under_load(test: str, n: int) -> dict:
    """Run ``test`` ``n`` times in a row beside one busy process per core; stops at the first failure."""
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    runs, ok, seconds = 0, 0, []
    try:
        for i in range(n):
            t0 = time.time()
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                                  cwd=ROOT, capture_output=True, text=True)
            seconds.append(time.time() - t0)
            runs += 1
            print(f"[chaos] {test} under load: run {i + 1}/{n} {'passed' if proc.returncode == 0 else 'FAILED'} "
                  f"({seconds[-1]:.0f}s)", flush=True)
            if proc.returncode != 0:
                return {"test": test, "runs": runs, "passed": ok, "load_processes": len(load), "seconds": seconds,
                        "failure_tail": proc.stdout[-3000:]}
            ok += 1
    finally:
        for p in load:
            p.kill()
    return {"test": test, "runs": runs, "passed": ok, "load_processes": len(load), "seconds": seconds}


def markdown(result: dict) -> str:
    lines = [
        "# Chaos suite", "",
        f"**{'PASSED' if result['passed'] else 'FAILED'}**: {result['runs_completed']}/{result['runs']} runs "
        f"completed, {result['faults_total']} faults injected, samples lost {result['samples_lost']}, duplicates "
        f"{result['duplicates']}, staleness violations {result['violations']}, weights mismatches "
        f"{result['weights_mismatches']}; every run's ledger ok: {result.get('ledger_ok')}; every trainer-process kill "
        f"between two recovery checkpoints rolled back steps: {result.get('rollback_exercised')}.", "",
        "| scenario | faults | after step | completed | restarts | recovery s | samples lost | dup | violations "
        "| weights | ledger | rolled back groups | training s | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["scenarios"]:
        rec = "—" if r["recovery_s"] is None else f"{r['recovery_s']:.1f}"
        w = "ok" if r["weights"].get("ok") else ("—" if not r["weights"] else "MISMATCH")
        at = "—" if r["steps_before_fault"] is None else r["steps_before_fault"]
        rl = "—" if r["rl_seconds"] is None else f"{r['rl_seconds']:.1f}"
        lines.append(f"| {r['scenario']} | {', '.join(r['faults'])} | {at} | "
                     f"{'yes' if r['completed'] else 'NO: ' + r['error'][:80]} | {r['restarts'] or '—'} | {rec} "
                     f"| {r['samples_lost']} | {r['duplicates']} | {r['violations']} | {w} "
                     f"| {'ok' if r['ledger'].get('ok') else 'BROKEN'} | {r.get('rolled_back_groups', '—')} "
                     f"| {rl} | {r['wall_s']:.0f} |")
    lines += ["", "Recovery time (fault → next finished training step), per component:", "",
              "| component | median s | max s | runs |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['median']:.1f} | {v['max']:.1f} | {v['n']} |" for k, v in result["recovery_s"].items()]
    flaky = result.get("flaky_test")
    if flaky:
        lines += ["", f"`{flaky['test']}`: {flaky['passed']}/{flaky['runs']} passed in a row beside "
                      f"{flaky['load_processes']} busy processes."]
    lines += ["", provenance_line(result["provenance"]), ""]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rec = result["recovery_s"]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    names = list(rec)
    ax.bar(names, [rec[k]["median"] for k in names], label="median")
    ax.scatter(names, [rec[k]["max"] for k in names], color="black", zorder=3, label="max")
    ax.set_ylabel("seconds to the next training step")
    ax.set_title("Chaos suite: recovery time per fault")
    ax.tick_params(axis="x", rotation=35)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = RecordParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "deploy/configs/smoke.yaml"), help="base config (model, task)")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--only", default="", help="comma-separated scenario names (default: all)")
    parser.add_argument("--repeat", type=int, default=20, help="runs of the lost-instance test under load (0: skip)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one run may take")
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench-chaos"))
    parser.add_argument("--out", default=None)
    ns = parser.parse_args()
    names = {x for x in ns.only.split(",") if x}
    unknown = names - {s.name for s in SCENARIOS}
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; known: {[s.name for s in SCENARIOS]}")
    if ns.iterations < 6 or ns.repeat < 0:
        parser.error("--iterations >= 6 (a trainer kill lands between the recovery checkpoints of steps 3 and 6) "
                     "and --repeat >= 0")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import shutil

    from services.common.config import load_config
    from services.policy.model import build_policy, save_policy

    work = Path(ns.work)
    shutil.rmtree(work, ignore_errors=True)
    base = load_config(ns.config)
    checkpoint = work / "policy"
    save_policy(build_policy(base.model), checkpoint)  # built from the config: nothing downloaded
    results = []
    for s in [s for s in SCENARIOS if not names or s.name in names]:
        print(f"[chaos] {s.name} ...", flush=True)
        r = run_scenario(s, work, str(checkpoint), Path(ns.config), ns.iterations, ns.timeout)
        print(f"[chaos] {s.name}: {'completed' if r.completed else 'FAILED ' + r.error[:300]}, recovery "
              f"{r.recovery_s if r.recovery_s is None else round(r.recovery_s, 1)} s, lost {r.samples_lost}, "
              f"dup {r.duplicates}, violations {r.violations}, weights {r.weights.get('ok')}", flush=True)
        results.append(r)
    result = {**summarize(results), "scenarios": [asdict(r) for r in results]}
    if ns.repeat:
        result["flaky_test"] = repeat_under_load(FLAKY_TEST, ns.repeat)
    result["passed"] = passed(result)
    result["provenance"] = provenance(Path(__file__), {"iterations": ns.iterations,
                                                       "scenarios": [asdict(s) for s in SCENARIOS],
                                                       "engine": "hf"}, Path(ns.config).resolve(), "hf")
    partial = bool(names)  # a subset never overwrites the results of record
    print(write_results(results_dir(ns.out, partial), "chaos", result, markdown, plot))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
