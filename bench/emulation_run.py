"""A 2-instance real run beside its emulation (issue 53): the same run, once real and once EMULATED.

**Real**: ``deploy/configs/default.yaml`` (braid-tiny from its warm start, the arith task, one_step)
with ``--instances`` (2) vLLM-CPU SGS instances, the real learner and the rule reward, every
process real, ``--iterations`` iterations; its generation log keeps every sample's length.

**Its emulation**: the same config and overrides with the three emulated parts, replaying what the
real round measured and nothing else:

- ``generation.engine: emulated`` with the latency profile ``braid profile`` measured in this run
  (vLLM pinned to one core, one thread, ``--profile-repeats`` a point) and the lengths of the real
  round's generation log;
- ``trainer.backend: emulated`` (``cpu-local``, one learner) with the step-time profile
  ``braid profile-train`` measured in this run;
- ``reward.kind: emulated`` at the real round's mean reward.

Compared (declared before the run): a round's steady iterations (the first left out) of each run,
``iteration_time_s``, ``gen_time_s`` and ``train_time_s`` (means) and samples per second (the
samples the iterations consumed / their time); per round the error emulated / real - 1, and the
median over ``--rounds`` (>= 3) rounds with the spread. Beside them each side's trained fraction:
the real reward is correlated within a prompt's group (a group whose rewards are all equal is not
trained), the emulated rate is drawn per sample, so the emulated learner trains more of each batch.
Reported beside the fidelity targets, with **no target of its own**: the emulation gives each
instance and the learner a device of its own (as on GPUs) while the real run's instances, learner,
reward and orchestrator share this machine's cores, so the emulation is expected to run faster by
about the contention the real run's ``process_cpu`` shows (kept beside each round). Each round runs
real first, then its emulation (the emulation replays the real round's lengths and reward, so the
order cannot rotate).

EMULATED: the emulated run's times are the profiles' predictions, never measurements.

    python bench/emulation_run.py [--rounds 3] [--instances 2] [--iterations 10]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.engine import pinned_env  # noqa: E402
from bench.fleet import run_config as launch  # noqa: E402
from bench.report_io import (  # noqa: E402
    RecordParser,
    of_record_or_scratch,
    provenance,
    provenance_line,
    results_dir,
    set_json_key,
    spread,
)

CONFIG = ROOT / "deploy/configs/default.yaml"
RUNS = ROOT / "bench/runs/emulation_run"
METRICS = ("iteration_time_s", "gen_time_s", "train_time_s", "samples_per_s")
PROFILE_CPU = 1  # the core ``braid profile`` measures one instance on


# ---------------------------------------------------------------- pure helpers
def steady(rows: list[dict]) -> dict:
    """A run's steady iterations (the first left out): mean times and trained samples per second."""
    rows = rows[1:]
    if not rows:
        raise ValueError("a run needs at least 2 iterations: the first is left out")
    out = {m: statistics.fmean(r[m] for r in rows) for m in METRICS[:3]}
    out["samples_per_s"] = sum(r["samples"] for r in rows) / sum(r["iteration_time_s"] for r in rows)
    out["trained_fraction"] = sum(r["trained_samples"] for r in rows) / sum(r["samples"] for r in rows)
    out["iterations"] = len(rows)
    return out


def compare(rounds: list[dict]) -> dict:
    """Per quantity: each side's values over the rounds and the paired errors emulated / real - 1."""
    out = {}
    for m in METRICS:
        real = [r["real"]["steady"][m] for r in rounds]
        emu = [r["emulated"]["steady"][m] for r in rounds]
        per = [e / x - 1.0 for e, x in zip(emu, real, strict=True)]
        out[m] = {"measured_real": spread(real), "EMULATED": spread(emu), "error": {**spread(per), "per_round": per}}
    return out


def emulation_overrides(profile: str, train_profile: str, genlog: str, reward: float) -> list[str]:
    """The overrides that turn the real run's config into its emulation."""
    return ["generation.engine=emulated", f"generation.emulation.profile={profile}",
            f"generation.emulation.lengths={genlog}", "generation.emulation.time_scale=1.0",
            "trainer.backend=emulated", "trainer.emulation.gpu=cpu-local", "trainer.emulation.gpus=1",
            f"trainer.emulation.train_profile={train_profile}", "reward.kind=emulated", f"reward.rate={reward:.6f}"]


def markdown(res: dict) -> str:
    p = res["provenance"]
    lines = ["# A 2-instance real run beside its emulation", "",
             f"{provenance_line(p)} Command: `{p['command']}`.", "",
             f"{res['rounds']} rounds, each a real run of `deploy/configs/default.yaml` on {res['instances']} vLLM-CPU "
             f"instances ({res['iterations']} iterations, the first left out) and then its EMULATED replay (the "
             "round's lengths and mean reward, the profiles `braid profile` and `braid profile-train` measured in "
             "this run). No target: the emulation gives every instance and the learner a device of its own; the "
             "real run's processes share this machine's cores (its `process_cpu` beside).", "",
             "| quantity | real (measured) | EMULATED | error (emulated / real - 1) |", "|---|---|---|---|"]
    for m, c in res["compare"].items():
        e = c["error"]
        lines.append(f"| {m} | {_c(c['measured_real'])} | {_c(c['EMULATED'])} | {e['median']:+.1%} "
                     f"[{e['min']:+.1%}, {e['max']:+.1%}] |")
    frac = {side: statistics.median(r[side]["steady"].get("trained_fraction", 1.0) for r in res["rounds_detail"])
            for side in ("real", "emulated")}
    lines += ["", f"Trained fraction of each batch (median over rounds): real {frac['real']:.2f}, EMULATED "
              f"{frac['emulated']:.2f} (a group whose rewards are all equal is not trained)."]
    busy = [r["real"]["cores_busy"] for r in res["rounds_detail"] if r["real"].get("cores_busy") is not None]
    if busy:
        lines += ["", f"The real runs' processes kept {statistics.median(busy):.2f} of {res['cores']} cores busy "
                  "between their first and last iteration (median over rounds)."]
    return "\n".join([*lines, ""])


def _c(s: dict) -> str:
    return f"{s['median']:.3g} [{s['min']:.3g}-{s['max']:.3g}]"


# ---------------------------------------------------------------- mechanism
def run_config(run_dir: Path, overrides: list[str]) -> list[dict]:
    """One run of ``CONFIG`` with ``overrides`` through the launcher (every process real); its rows."""
    from flows.artifacts import read_metrics

    return read_metrics(launch(CONFIG, run_dir, lambda _: overrides) / "metrics.jsonl")


def measure_profiles(ns, out: Path) -> tuple[Path, Path]:
    """``braid profile`` (vLLM pinned to one core) and ``braid profile-train`` on the warm start."""
    from services.common.config import load_config
    from services.policy.warmstart import ensure_warmstart

    model = str(ensure_warmstart(load_config(CONFIG, base_overrides(ns)), progress=False).resolve())
    gen, train = out / "profile.json", out / "train-profile.json"
    cli = [sys.executable, "-m", "flows.cli"]
    for cmd, cpus in (([*cli, "profile", "--config", str(CONFIG), "--model", model, "--out", str(gen),
                        "--hardware", f"cpu-local-core{PROFILE_CPU}", "--repeats", str(ns.profile_repeats)],
                       {PROFILE_CPU}),
                      ([*cli, "profile-train", "--config", str(CONFIG), "--model", model, "--out", str(train)], None)):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=ROOT,
                              env=pinned_env(PROFILE_CPU) if cpus else None,
                              preexec_fn=(lambda c=cpus: os.sched_setaffinity(0, c)) if cpus else None)
        if proc.returncode != 0:
            raise RuntimeError(f"{cmd[3]} failed (rc {proc.returncode}): {proc.stderr[-3000:]}")
        print(f"{cmd[3]} measured in {time.perf_counter() - t0:.0f} s", flush=True)
    return gen, train


def base_overrides(ns) -> list[str]:
    return [f"generation.instances={ns.instances}", f"trainer.iterations={ns.iterations}", "eval.prompts=32",
            f"runs_dir={RUNS}", f"cache_dir={ROOT / '.cache'}"]


def run_round(ns, r: int, gen_profile: Path, train_profile: Path) -> dict:
    """The real run, then its emulation; each side's steady figures and its process CPU."""
    real_dir, emu_dir = RUNS / f"round{r}-real", RUNS / f"round{r}-emulated"
    genlog = RUNS / f"round{r}-genlog.sqlite"
    genlog.unlink(missing_ok=True)
    real_rows = run_config(real_dir, [*base_overrides(ns), f"generation.genlog={genlog}"])
    reward = statistics.fmean(x["reward_mean"] for x in real_rows)
    emu_rows = run_config(emu_dir, [*base_overrides(ns), *emulation_overrides(str(gen_profile), str(train_profile),
                                                                              str(genlog), reward)])
    return {"real": _side(real_dir, real_rows), "emulated": _side(emu_dir, emu_rows), "reward_rate": reward}


def _side(run_dir: Path, rows: list[dict]) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    cpu = summary.get("process_cpu") or {}
    return {"steady": steady(rows), "cores_busy": (cpu.get("steady") or {}).get("cores_busy"),
            "process_cpu": cpu, "emulated": "emulated" in summary, "run_dir": str(run_dir)}


def main() -> None:
    ap = RecordParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--profile-repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    ns = ap.parse_args()
    if ns.iterations < 2 or ns.rounds < 1:
        ap.error("--iterations >= 2 (the first is left out) and --rounds >= 1")
    RUNS.mkdir(parents=True, exist_ok=True)
    gen_profile, train_profile = measure_profiles(ns, RUNS)
    rounds = [run_round(ns, r, gen_profile, train_profile) for r in range(ns.rounds)]
    record = {"rounds": ns.rounds, "instances": ns.instances, "iterations": ns.iterations,
              "profile_repeats": ns.profile_repeats}
    res = {"provenance": provenance(Path(__file__), record, CONFIG, "vllm,emulated"), **record,
           "cores": os.cpu_count(), "compare": compare(rounds), "rounds_detail": rounds,
           "profiles": {"generation": json.loads(gen_profile.read_text())["step_cost"],
                        "training_path": str(train_profile)},
           "labels": "EMULATED figures are the profiles' predictions, never measurements"}
    out = results_dir(ns.out, False)
    set_json_key(out / "emulation.json", "real_run", res)
    (of_record_or_scratch(out, res) / "emulation_run.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
