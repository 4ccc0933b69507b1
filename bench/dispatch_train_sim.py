"""The simulator against the real training runs of ``bench/dispatch_train.py`` (issue 30 item 5).

Every run of ``bench/dispatch_train.py`` (8 dispatch variants x 3 interleaved rounds per regime,
vLLM, 2 SGS instances pinned to **one** core) is replayed, iteration by iteration, on exactly what
the run generated, in two models:

- **the launch path** (``allocator.launch_sim.simulate_launched``, the model of record): the
  orchestrator's gating — a group starts only when the instance has room (``instance_capacity``),
  placed at that moment by the run's live ``GroupDispatcher`` (its books carried from step to
  step), in the LPT launch order when the run had estimates and LPT admission;
- **the whole step at once** (``allocator.simulator.simulate``, what ``braid allocate`` and
  ``bench/dispatch.py`` use; kept beside, ``*_static`` keys): the live dispatch policy function
  over all of a step's groups at its start, then each instance's admission queue.

Both run each instance's admission queue, batch limit and KV cache and decode steps at the
profile's step cost, on:

- each step's groups: the prompt ids the run's ledger consumed in that step, each group's forced
  length and estimate from the run's own replay (``forced_length_replay``: file, seed, estimates;
  ``ReplayLengths`` is a pure function of the prompt id), 8 samples each;
- the variant's policy and admission as the run's config set them (``pick``, the orchestrator's
  staleness-aware least-loaded pick without a dispatcher, as ``least_loaded``), dispatch by group,
  the dispatcher's recent-length window and estimate-error pairs from the run's earlier steps;
- the instances' limits from the run's config (``generation.max_inflight`` sequences, the KV
  blocks), **sharing one core** (``cores=1``: processor sharing, ``shared_makespan``), as pinned.

The profile is **measured on vLLM's serving path** on this machine (``braid profile`` on the
runs' own config, pinned to the SGS core; ``PROFILE``, written once and reused). Declared before
the run of record:

- compared quantity: the **generation span** of a step (first sample's start to the last finish,
  ``metrics.jsonl``), mean over the steady steps (the first left out, as ``gen_span_s``), median
  over a variant's rounds: measured vs simulated;
- **calibration**: one scale (``calibrate``: measured / simulated of ``CALIBRATION_VARIANT``'s
  median; ``allocator.simulator.calibrate_spec``'s scale-only fit) applied to every variant;
- ``sim_error_max_per_policy``: the largest |simulated / measured - 1| over the **other** variants
  (the calibration variant's own is reported beside, not judged); goal ``TARGET_ERROR``;
- ``sim_policy_order_matches``: the variants ranked by simulated span equal their ranking by
  measured span; beside it ``sim_resolved_pairs_agree``: the share of variant pairs whose measured
  rounds do not overlap (the measurement resolves their order) that the simulator orders the same.

Writes ``training_sim`` and the two headline keys into ``bench/results/dispatch.json`` (the rest
is kept) and ``dispatch_train_sim.md``.

    python bench/dispatch_train_sim.py [--regime sync_small_batch] [--profile FILE] [--out DIR]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from itertools import combinations
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report_io import RecordParser, provenance, provenance_line, results_dir, set_json_key  # noqa: E402

TARGET_ERROR = 0.15
CALIBRATION_VARIANT = "round_robin"
REGIME_OF_RECORD = "sync_small_batch"  # the regime the simulator models (a step's groups ready at its start)
PROMPT_TOKENS = 12  # the arith task's prompts (bos + "247-9>200=" and a little more)
PROFILE = ROOT / "bench/profiles/vllm-cpu-dispatch-train.json"  # an input of the bench, not a result
SGS_CORE = "0"  # bench/dispatch_train.py pins both SGS instances to CPU 0
HEADLINE_KEYS = ("sim_error_max_per_policy", "sim_policy_order_matches", "sim_resolved_pairs_agree")
# what this bench owns in dispatch.json (bench/dispatch.py keeps them)
KEYS = ("training_sim", *HEADLINE_KEYS, *(f"{k}_static" for k in HEADLINE_KEYS))


def step_groups(run_dir: Path) -> list[list[str]]:
    """The prompt ids each step consumed, in step order (the run's ledger)."""
    steps: dict[int, list[str]] = {}
    for line in (run_dir / "ledger.jsonl").read_text().splitlines():
        ev = json.loads(line)
        if ev.get("event") == "consume":
            steps.setdefault(int(ev["step"]), []).append(ev["prompt_id"])
    return [steps[k] for k in sorted(steps)]


def step_spans(run_dir: Path) -> list[float]:
    """Each step's measured generation span (s), in step order."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["gen_last_finish"] - r["gen_first_start"] for r in rows]


def variant_policy(variant: str, cfg: dict) -> tuple[str, str]:
    """(dispatch policy, admission) the run used: ``pick`` had no dispatcher (least-loaded pick)."""
    gen = cfg["generation"]
    return ("least_loaded" if variant == "pick" else gen["dispatch"]["policy"]), gen["admission"]


def _replay(cfg: dict):
    from services.rollout.length_replay import ReplayLengths

    rep = cfg["forced_length_replay"]
    return ReplayLengths.load(rep["file"], cfg["generation"]["max_new_tokens"], rep["seed"], rep["estimates"])


def simulate_run_launched(run_dir: Path, variant: str, profile, cores: float | None = 1) -> list[float]:
    """Simulated generation span of each step on the orchestrator's launch path (``MODEL``): groups
    start as earlier ones free room, placed by the run's live dispatcher (None for ``pick``), whose
    length history carries from step to step as in the run (s, uncalibrated). ``cores``: the instances share
    that many (None: each its own accelerator, as an emulated fleet's)."""
    from allocator.launch_sim import SimGroup, simulate_launched
    from services.common.config import RunConfig
    from services.generation.scheduling.dispatch import NEEDS_COST
    from services.rollout.dispatching import GroupDispatcher, dispatches
    from services.rollout.modes import instance_capacity

    raw = json.loads((run_dir / "config.json").read_text())
    cfg = RunConfig.model_validate(raw)
    gen, tc = cfg.generation, cfg.trainer
    replay = _replay(raw)
    spec = profile.instance_spec(max_batch=gen.max_inflight, kv_capacity_tokens=gen.num_blocks * gen.page_size)
    if tc.redundancy_samples:
        raise ValueError(f"{run_dir}: redundant samples (a group done before all its samples are) are not modelled")
    size = tc.group_size
    capacity = instance_capacity(size, tc.max_inflight_groups, gen.max_inflight)
    dispatcher = (GroupDispatcher(gen, lambda: None, spec if gen.dispatch.policy in NEEDS_COST else None)
                  if dispatches(cfg, 1) else None)
    spans = []
    for prompts in step_groups(run_dir):
        ests = GroupDispatcher.given([replay.estimate(p) for p in prompts])
        groups = [SimGroup(p, PROMPT_TOKENS, (replay.length(p),) * size, e) for p, e in zip(prompts, ests, strict=True)]
        spans.append(simulate_launched(groups, spec, gen.instances, capacity=capacity, admission=gen.admission,
                                       dispatcher=dispatcher, cores=cores).makespan_s)
    return spans


def simulate_run(run_dir: Path, variant: str, profile) -> list[float]:
    """Simulated generation span of each step of the run with the whole step dispatched at its start
    (``allocator.simulator.simulate``, the SGS router's model; s, uncalibrated)."""
    from allocator.simulator import SimSample, simulate
    from services.generation.scheduling import EstimateErrorModel, LengthDistribution

    cfg = json.loads((run_dir / "config.json").read_text())
    gen, dcfg = cfg["generation"], cfg["generation"]["dispatch"]
    replay = _replay(cfg)
    policy, admission = variant_policy(variant, cfg)
    spec = profile.instance_spec(max_batch=gen["max_inflight"], kv_capacity_tokens=gen["num_blocks"] * gen["page_size"])
    size = cfg["trainer"]["group_size"]
    history: list[float] = []
    pairs: list[tuple[float, float]] = []
    spans = []
    for k, prompts in enumerate(step_groups(run_dir)):
        samples = [SimSample(f"{p}/{j}", PROMPT_TOKENS, replay.length(p), replay.estimate(p), group=p)
                   for p in prompts for j in range(size)]
        window = history[-dcfg["length_window"]:]
        lengths = LengthDistribution(window) if len(window) >= dcfg["min_history"] else None
        errors = EstimateErrorModel(pairs[-dcfg["length_window"]:]) if len(pairs) >= dcfg["min_history"] else None
        res = simulate(samples, spec, gen["instances"], policy=policy, admission=admission, lengths=lengths,
                       errors=errors, alpha=dcfg["alpha"], seed=k, scenarios=dcfg["scenarios"], unit="group", cores=1)
        spans.append(res.makespan_s)
        history += [float(s.length) for s in samples]
        pairs += [(s.estimate, float(s.length)) for s in samples if s.estimate is not None]
    return spans


def steady_mean(spans: list[float]) -> float:
    return statistics.fmean(spans[1:]) if len(spans) > 1 else spans[0]


def judge(measured: dict[str, list[float]], simulated: dict[str, list[float]], calibration: str) -> dict:
    """Per-variant medians over rounds, the calibration scale, errors and order agreement (pure)."""
    if calibration not in measured:
        raise ValueError(f"the calibration variant {calibration!r} was not measured ({sorted(measured)})")
    med_m = {v: statistics.median(xs) for v, xs in measured.items()}
    med_s = {v: statistics.median(xs) for v, xs in simulated.items()}
    scale = med_m[calibration] / med_s[calibration]
    errors = {v: abs(med_s[v] * scale / med_m[v] - 1.0) for v in measured}
    judged = {v: e for v, e in errors.items() if v != calibration}
    order_m = sorted(measured, key=lambda v: med_m[v])
    order_s = sorted(measured, key=lambda v: med_s[v])
    resolved = [(a, b) for a, b in combinations(sorted(measured), 2)
                if max(measured[a]) < min(measured[b]) or max(measured[b]) < min(measured[a])]
    agree = [(a, b) for a, b in resolved if (med_m[a] < med_m[b]) == (med_s[a] < med_s[b])]
    return {"scale": scale, "measured_s": med_m, "simulated_s": {v: x * scale for v, x in med_s.items()},
            "error": errors, "sim_error_max_per_policy": max(judged.values()) if judged else None,
            "worst_variant": max(judged, key=judged.get) if judged else None,
            "calibration_variant": calibration, "calibration_error": errors[calibration],
            "order_measured": order_m, "order_simulated": order_s, "sim_policy_order_matches": order_m == order_s,
            "resolved_pairs": [list(p) for p in resolved], "agreeing_pairs": [list(p) for p in agree],
            "sim_resolved_pairs_agree": len(agree) / len(resolved) if resolved else None}


def measure_profile(run_dir: Path, out: Path) -> None:
    """``braid profile`` on the runs' own config, pinned to the SGS core (vLLM's serving path)."""
    cmd = ["taskset", "-c", SGS_CORE, sys.executable, "-m", "flows.cli", "profile", "--config",
           str(run_dir / "config.json"), "--out", str(out)]
    print("measuring the vLLM profile:", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def verdict_lines(j: dict, name: str) -> list[str]:
    ok = j["sim_error_max_per_policy"] is not None and j["sim_error_max_per_policy"] <= TARGET_ERROR
    return [f"- {name}: `sim_error_max_per_policy` {j['sim_error_max_per_policy']:.1%} ({j['worst_variant']}), goal "
            f"<= {TARGET_ERROR:.0%}: {'met' if ok else '**missed**'}; `sim_policy_order_matches`: "
            f"{j['sim_policy_order_matches']} (simulated {' < '.join(j['order_simulated'])}); of the "
            f"{len(j['resolved_pairs'])} pairs the measurement resolves (rounds do not overlap) it orders "
            f"{len(j['agreeing_pairs'])} the same"]


def markdown(res: dict) -> str:
    j, st = res["judged"], res["judged_static"]
    lines = ["# The simulator against the real training runs (bench/dispatch_train_sim.py)", "",
             provenance_line(res["provenance"]), "",
             f"Regime `{res['regime']}` (runs of {res['runs_commit'][:12]}); profile: "
             f"{res['profile']['notes'][:160]}...; 2 instances sharing one core; each model calibrated on "
             f"`{j['calibration_variant']}` (scale {j['scale']:.2f} launch path, {st['scale']:.2f} whole step at "
             f"once).", "",
             "| variant | measured span s (median of rounds) | launch path s | error | whole step at once s | error |",
             "|---|---:|---:|---:|---:|---:|"]
    for v in j["order_measured"]:
        tag = " (calibration)" if v == j["calibration_variant"] else ""
        lines.append(f"| {v}{tag} | {j['measured_s'][v]:.3f} | {j['simulated_s'][v]:.3f} | {j['error'][v]:.1%} "
                     f"| {st['simulated_s'][v]:.3f} | {st['error'][v]:.1%} |")
    lines += ["", f"Measured order: {' < '.join(j['order_measured'])}.", "",
              *verdict_lines(j, "launch path (the model of record: the orchestrator's gating, "
                                "`allocator/launch_sim.py`)"),
              *verdict_lines(st, "whole step at once (the earlier model, `allocator.simulator.simulate`)")]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = RecordParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--regime", default=REGIME_OF_RECORD)
    ap.add_argument("--profile", default=str(PROFILE), help="vLLM profile (measured here when the file is missing)")
    ap.add_argument("--out", default=None)
    ns = ap.parse_args()
    from services.generation.scheduling.profiles import load_profile

    # before anything is written: a profile measured by this run must not make its own tree dirty
    prov = provenance(Path(__file__), {"regime": ns.regime, "calibration": CALIBRATION_VARIANT,
                                       "prompt_tokens": PROMPT_TOKENS, "cores": 1}, inputs=[Path(ns.profile)])
    out = results_dir(ns.out, False)
    training = json.loads((out / "dispatch.json").read_text()).get("training") or {}
    regime = (training.get("regimes") or {}).get(ns.regime)
    if regime is None:
        sys.exit(f"dispatch.json has no training regime {ns.regime!r}: run bench/dispatch_train.py "
                 f"--regimes {ns.regime}")
    runs = {v: [Path(r["run_dir"]) for r in rs] for v, rs in regime["runs"].items()}
    if missing := [str(d) for ds in runs.values() for d in ds if not (d / "ledger.jsonl").is_file()]:
        sys.exit(f"{len(missing)} run directories of that regime are gone (first: {missing[0]}): re-run "
                 "bench/dispatch_train.py")
    profile_path = Path(ns.profile)
    if not profile_path.is_file():
        measure_profile(next(iter(runs.values()))[0], profile_path)
    profile = load_profile(profile_path)
    measured = {v: [steady_mean(step_spans(d)) for d in ds] for v, ds in runs.items()}
    simulated: dict[str, dict[str, list[float]]] = {"launch": {}, "static": {}}
    for v, ds in runs.items():
        simulated["launch"][v] = [steady_mean(simulate_run_launched(d, v, profile)) for d in ds]
        simulated["static"][v] = [steady_mean(simulate_run(d, v, profile)) for d in ds]
        print(f"{v:16s} measured {statistics.median(measured[v]):.3f}s  simulated (raw) launch path "
              f"{statistics.median(simulated['launch'][v]):.3f}s, whole step at once "
              f"{statistics.median(simulated['static'][v]):.3f}s", flush=True)
    judged = judge(measured, simulated["launch"], CALIBRATION_VARIANT)
    static = judge(measured, simulated["static"], CALIBRATION_VARIANT)
    res = {"regime": ns.regime, "runs_commit": regime["provenance"]["commit"], "model": "launch", "judged": judged,
           "judged_static": static, "target_error": TARGET_ERROR,
           "per_round": {"measured_s": measured, "simulated_raw_s": simulated["launch"],
                         "simulated_static_raw_s": simulated["static"]},
           "profile": {"file": (str(profile_path.relative_to(ROOT)) if profile_path.is_relative_to(ROOT)
                                else str(profile_path)),
                       "fit_rel_rmse": profile.fit_rel_rmse, "notes": profile.notes},
           "provenance": prov}
    set_json_key(out / "dispatch.json", "training_sim", res)
    for key in HEADLINE_KEYS:
        set_json_key(out / "dispatch.json", key, judged[key])
        set_json_key(out / "dispatch.json", f"{key}_static", static[key])  # the earlier model's, beside
    (out / "dispatch_train_sim.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
