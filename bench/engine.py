"""Generation engines side by side: tokens/s and time to the last sample, plus weight-swap latency.

Engines: ``vllm``, ``hf`` (static batches) through ``create_engine``, and ``generate``:
transformers' ``model.generate``, one batched call per round. The result of record also holds
``cb`` (transformers' continuous batching with per-sequence attention), measured by this script
before that engine was retired (2026-11-25, the run whose provenance the JSON records); the
engine is gone, so later runs compare vLLM with ``hf`` and ``generate`` only. Model: the default policy
(``deploy/configs/default.yaml``'s ``model``, random init, saved to a temp dir).

- **Workload** (forced-length replay): for N requests, ``ProblemSampler(seed, **task.distribution())``
  draws N arith problems (the task's own power law, P(q) ∝ q^-alpha on [min_steps, max_steps]);
  prompt = the problem's text encoded with the policy tokenizer; forced output length = the
  reference solution's tokens (``demonstration``: one token per character) + 1 for EOS, capped at
  ``--cap``. All N are submitted at once with ``ignore_eos=True`` and polled until all are done.
  tokens/s = generated tokens / time from the first submit to the last sample.
- **generate** cannot force per-request lengths: it runs ``max_new_tokens = min_new_tokens =``
  the longest forced length (EOS suppressed), left padding, ``do_sample=True`` at the engines'
  temperature; only each request's forced length counts as useful tokens; time to the last
  sample = the call's wall time.
- **Processes**: each (repeat, engine) runs in its own subprocess (``--worker``): vLLM and cb
  change process-wide state. The worker pins itself to one CPU (``--cpu``; vLLM's OpenMP
  threads bound to it too), torch threads 1, builds the engine once, runs one untimed warm-up
  round (the largest N), then ``--rounds`` timed rounds per N, then ``--swaps``
  ``load_weights(full state dict)`` calls.
- **Repeats** interleave engines in rotating order (ABCD BCDA CDAB); per engine and N the
  median and min/max over repeats, ratios per repeat then their median and min/max.

    python bench/engine.py [--repeats 3] [--rounds 5] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report_io import (  # noqa: E402
    QUICK_OUT,
    RecordParser,
    provenance,
    provenance_line,
    ratio_spread,
    results_dir,
    spread,
    write_results,
)

CONFIG = ROOT / "deploy/configs/default.yaml"
ENGINES = ("vllm", "hf", "generate")
BASELINES = ("cb", "generate", "hf")  # cb: only in results measured before its retirement
GEN = {"num_blocks": 512, "page_size": 32, "max_inflight": 256, "max_batch_tokens": 2048, "threads": 1}
MARK = "ENGINE_BENCH_RESULT "


# ---------------------------------------------------------------- pure helpers (unit tested)
def sample_workload(dist: dict, n: int, seed: int, cap: int) -> list[tuple[str, int]]:
    """(prompt text, forced output tokens) of ``n`` arith problems drawn by the task's sampler."""
    from services.tasks.arith import ProblemSampler, demonstration

    return [(p.prompt, min(cap, len(demonstration(p)) + 1)) for p in ProblemSampler(seed, **dist).batch(n)]


def rotation(engines: tuple[str, ...], repeat: int) -> list[str]:
    k = repeat % len(engines)
    return list(engines[k:] + engines[:k])


def summarise(repeats: list[dict[str, dict]], sizes: list[int]) -> dict:
    """Per engine and N the spread of tokens/s and time to the last sample over repeats (each
    repeat's value: the median of its worker's timed rounds), the ratios and weight-swap times."""
    engines = sorted({e for rep in repeats for e in rep}, key=lambda e: (*ENGINES, e).index(e))
    per: dict[str, dict] = {e: {} for e in engines}
    tps: dict[str, dict[str, list[float]]] = {e: {} for e in engines}
    for e in engines:
        for n in map(str, sizes):
            rounds = [rep[e]["sizes"][n] for rep in repeats]
            tps[e][n] = [statistics.median(r["tokens_per_s"] for r in rs) for rs in rounds]
            per[e][n] = {"tokens_per_s": spread(tps[e][n]),
                         "time_to_last_sample_s": spread([statistics.median(r["last_sample_s"] for r in rs)
                                                          for rs in rounds]),
                         "useful_tokens": rounds[0][0]["useful_tokens"],
                         "generated_tokens": rounds[0][0]["generated_tokens"],
                         "lengths_ok": all(r["lengths_ok"] for rs in rounds for r in rs), "measured_in_this_run": True}
        swaps = [statistics.median(rep[e]["weight_swap_s"]) for rep in repeats]
        per[e]["weight_swap_s"] = {**spread(swaps), "measured_in_this_run": True}
    ratios = {f"vllm_vs_{b}_tokens_per_s": {n: {**ratio_spread(tps["vllm"][n], tps[b][n]), "measured_in_this_run": True}
                                            for n in map(str, sizes)}
              for b in BASELINES if "vllm" in tps and b in tps}
    return {"engines": per, **ratios,
            "weight_swap_s": {e: per[e]["weight_swap_s"] for e in engines}}


def _cell(s: dict, fmt: str = "{:.0f}") -> str:
    return f"{fmt.format(s['median'])} [{fmt.format(s['min'])}–{fmt.format(s['max'])}]"


def markdown(result: dict) -> str:
    p, w = result["provenance"], result["workload"]
    lines = ["# Generation engines side by side", "",
             f"{provenance_line(p)} Command: `{p['command']}`.", "",
             f"Load average (1 min) {result['load_start'][0]:.2f} at start, {result['load_end'][0]:.2f} at end"
             + (f" — the machine was shared with a concurrent test run (pytest processes seen in "
                f"{sum(x['pytest_processes'] > 0 for x in result['load_samples'])} of {len(result['load_samples'])} "
                "samples, before each worker): noisy." if result.get("shared") else "."), "",
             f"Workload: arith task lengths (power law, seed {w['seed']}), forced with `ignore_eos`, capped at "
             f"{w['cap']} tokens; each worker pinned to CPU {w['cpu']}, 1 thread"
             + (f"; cb attention **{result['cb_attention']}**" if "cb_attention" in result else "")
             + f". Median [min–max] of {result['repeats']} interleaved repeats.", ""]
    for n in map(str, result["sizes"]):
        lines += [f"## N = {n} concurrent requests ({w['useful_tokens'][n]} tokens, "
                  f"median length {w['median_length'][n]}, max {w['max_length'][n]})", "",
                  "| engine | tokens/s | time to last sample (s) | tokens generated | lengths forced ok |",
                  "|---|---|---|---|---|"]
        for e, r in result["engines"].items():
            lines.append(f"| {e} | {_cell(r[n]['tokens_per_s'])} | {_cell(r[n]['time_to_last_sample_s'], '{:.2f}')} "
                         f"| {r[n]['generated_tokens']} | {r[n]['lengths_ok']} |")
        for b in BASELINES:
            if (key := f"vllm_vs_{b}_tokens_per_s") in result:
                lines.append(f"| **vllm / {b}** tokens/s | **{_cell(result[key][n], '{:.2f}x')}** | | | |")
        lines.append("")
    lines += per_repeat_lines(result)
    lines += ["## Weight swap (`load_weights` of the full state dict, median of each worker's swaps)", "",
              "| engine | seconds |", "|---|---|"]
    lines += [f"| {e} | {_cell(s, '{:.4f}')} |" for e, s in result["weight_swap_s"].items()]
    lines += ["", "`generate`: transformers' `model.generate`, one batched call per round (left padding, "
              "`do_sample=True`), `max_new_tokens = min_new_tokens =` the longest forced length, so every row "
              "runs to the longest; only each request's forced length counts as useful tokens (tokens/s "
              "above), and its time to the last sample is the call's wall time. `hf` is also a static batch "
              "but hands each request out the step it ends.", ""]
    return "\n".join(lines)


def per_repeat_lines(result: dict) -> list[str]:
    """tokens/s of each worker (median of its rounds) with the machine's load just before it started."""
    if not result.get("raw"):
        return []
    load = {x["before"]: x for x in result.get("load_samples", []) if "before" in x}
    lines = ["## Per repeat (tokens/s N=" + " / N=".join(map(str, result["sizes"])) + "; 1-min load average and "
             "pytest processes seen just before the worker started)", "",
             "| engine | " + " | ".join(f"repeat {r}" for r in range(len(result["raw"]))) + " |",
             "|---|" + "---|" * len(result["raw"])]
    for e in result["engines"]:
        cells = []
        for r, rep in enumerate(result["raw"]):
            tps = " / ".join(f"{statistics.median(x['tokens_per_s'] for x in rep[e]['sizes'][str(n)]):.0f}"
                             for n in result["sizes"])
            ld = load.get(f"repeat {r} {e}", {})
            cells.append(f"{tps} (load {ld.get('load1', float('nan')):.1f}, pytest {ld.get('pytest_processes', '?')})")
        lines.append(f"| {e} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines, sizes = list(result["engines"]), [str(n) for n in result["sizes"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(engines)
    for i, e in enumerate(engines):
        s = [result["engines"][e][n]["tokens_per_s"] for n in sizes]
        med = [x["median"] for x in s]
        err = [[m - x["min"] for m, x in zip(med, s, strict=True)], [x["max"] - m for m, x in zip(med, s, strict=True)]]
        ax.bar([j + i * width for j in range(len(sizes))], med, width, yerr=err, capsize=3, label=e)
    ax.set_xticks([j + width * (len(engines) - 1) / 2 for j in range(len(sizes))], [f"N={n}" for n in sizes])
    ax.set_ylabel("tokens/s (median, min–max)")
    ax.set_title("Generation engines, arith long-tail forced lengths")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------- worker (one engine, own process)
def engine_round(engine, prompts: list[list[int]], lengths: list[int], tag: str) -> dict:
    t0 = time.perf_counter()
    for i, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
        engine.submit(f"{tag}-{i}", p, n, ignore_eos=True)
    got: dict[str, int] = {}
    while len(got) < len(prompts):
        for out in engine.poll(0.05):
            if out.error:
                raise RuntimeError(f"{out.request_id}: {out.error}")
            got[out.request_id] = len(out.token_ids)
        if time.perf_counter() - t0 > 600:
            raise TimeoutError(f"{tag}: {len(got)}/{len(prompts)} done after 600 s")
    wall = time.perf_counter() - t0
    ok = all(got[f"{tag}-{i}"] == n for i, n in enumerate(lengths))
    return {"generated_tokens": sum(got.values()), "useful_tokens": sum(lengths), "last_sample_s": wall,
            "tokens_per_s": sum(got.values()) / wall, "lengths_ok": ok}


def generate_round(model, prompts: list[list[int]], lengths: list[int], pad: int, eos: int, temp: float) -> dict:
    import torch
    from transformers import GenerationConfig as HFGenerationConfig

    width, longest = max(map(len, prompts)), max(lengths)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):], mask[row, width - len(p):] = torch.tensor(p), 1
    cfg = HFGenerationConfig(do_sample=True, temperature=temp, top_k=None, top_p=None, max_new_tokens=longest,
                             min_new_tokens=longest, eos_token_id=eos, pad_token_id=pad)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
    wall = time.perf_counter() - t0
    new = out.shape[1] - width
    return {"generated_tokens": new * len(prompts), "useful_tokens": sum(lengths), "last_sample_s": wall,
            "tokens_per_s": sum(lengths) / wall, "lengths_ok": new == longest}


def _time_swaps(load, state: dict, swaps: int) -> list[float]:
    times = []
    for _ in range(swaps):
        t0 = time.perf_counter()
        load(state)
        times.append(time.perf_counter() - t0)
    return times


def worker(ns: argparse.Namespace) -> dict:
    """One engine in this process: build, warm up, timed rounds per N, weight swaps."""
    os.sched_setaffinity(0, {ns.cpu})
    import torch
    from transformers import AutoModelForCausalLM

    from services.common.config import GenerationConfig
    from services.generation.engine import create_engine

    torch.set_num_threads(1)
    torch.manual_seed(ns.seed)
    wl = json.loads(Path(ns.workload).read_text())
    gcfg = GenerationConfig(**wl["generation"])
    ref = AutoModelForCausalLM.from_pretrained(ns.model, local_files_only=True, dtype=torch.float32).eval()
    state = {k: v.detach().clone() for k, v in ref.state_dict().items()}
    t0 = time.perf_counter()
    if ns.worker == "generate":
        eos, pad = int(ref.config.eos_token_id), int(ref.config.pad_token_id)
        run = lambda ps, ls, tag: generate_round(ref, ps, ls, pad, eos, gcfg.temperature)  # noqa: E731
        load = lambda s: ref.load_state_dict(s, strict=True)  # noqa: E731
        engine = None
    else:
        engine = create_engine(ns.worker, ns.model, gcfg)
        run = lambda ps, ls, tag: engine_round(engine, ps, ls, tag)  # noqa: E731
        load = engine.load_weights
    res: dict = {"engine": ns.worker, "startup_s": time.perf_counter() - t0, "sizes": {}}
    big = wl["sizes"][str(max(map(int, wl["sizes"])))]
    t0 = time.perf_counter()
    run(big["prompts"], big["lengths"], "warmup")
    res["warmup_s"] = time.perf_counter() - t0
    for n, w in wl["sizes"].items():
        res["sizes"][n] = [run(w["prompts"], w["lengths"], f"n{n}-r{k}") for k in range(ns.rounds)]
    res["weight_swap_s"] = _time_swaps(load, state, ns.swaps)
    if engine is not None:
        engine.close()
    return res


# ---------------------------------------------------------------- orchestration
def pinned_env(cpu: int) -> dict[str, str]:
    """A benchmark worker's environment: vLLM's OpenMP threads bound to ``cpu``, one thread, offline."""
    return {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": str(cpu), "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_marked(cmd: list[str], cpu: int, mark: str, what: str) -> dict:
    """Run a worker process in ``pinned_env(cpu)``; its result is the JSON after ``mark`` on the last
    stdout line that starts with it (an error names ``what``, its exit code and its stderr's tail).
    ``--allow-dirty``: a worker writes no results, so its RecordParser must not refuse a dirty tree (the
    parent already checked, or runs --quick into scratch)."""
    proc = subprocess.run([*cmd, "--allow-dirty"], capture_output=True, text=True, timeout=1200, env=pinned_env(cpu),
                          cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(mark)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"worker {what} rc={proc.returncode}: {proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(mark):])


def run_worker(engine: str, ns: argparse.Namespace, model: str, workload: str) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", engine,
           "--model", model, "--workload", workload, "--rounds", str(ns.rounds), "--swaps", str(ns.swaps),
           "--cpu", str(ns.cpu), "--seed", str(ns.seed)]
    return run_marked(cmd, ns.cpu, MARK, engine)


def build_workload(ns: argparse.Namespace, tmp: Path) -> tuple[str, str, dict, dict]:
    """Save the policy and the workload file the workers read; returns their paths, the workload
    summary and the config record (hashed for provenance)."""
    from services.common.config import load_config
    from services.policy.model import build_policy, save_policy

    cfg = load_config(CONFIG)
    policy = build_policy(cfg.model)
    save_policy(policy, tmp / "model")
    gen = {**GEN, "max_new_tokens": ns.cap, "temperature": cfg.generation.temperature, "seed": ns.seed}
    sizes = {}
    for n in ns.sizes:
        items = sample_workload(cfg.task.distribution(), n, ns.seed, ns.cap)
        sizes[str(n)] = {"prompts": [policy.encode_prompt(t) for t, _ in items], "lengths": [k for _, k in items]}
    (tmp / "workload.json").write_text(json.dumps({"generation": gen, "sizes": sizes}))
    record = {"model": cfg.model.model_dump(mode="json"), "task": cfg.task.distribution(), "generation": gen,
              "sizes": ns.sizes, "cap": ns.cap, "seed": ns.seed, "rounds": ns.rounds, "swaps": ns.swaps,
              "repeats": ns.repeats, "cpu": ns.cpu}
    lens = {n: s["lengths"] for n, s in sizes.items()}
    summary = {"seed": ns.seed, "cap": ns.cap, "cpu": ns.cpu, "task_distribution": cfg.task.distribution(),
               "useful_tokens": {n: sum(v) for n, v in lens.items()},
               "median_length": {n: statistics.median(v) for n, v in lens.items()},
               "max_length": {n: max(v) for n, v in lens.items()},
               "mean_prompt_tokens": {n: statistics.mean(map(len, s["prompts"])) for n, s in sizes.items()},
               "lengths": lens, "measured_in_this_run": True}
    return str(tmp / "model"), str(tmp / "workload.json"), summary, record


def machine_load() -> dict:
    """1-minute load average and how many other processes run pytest now (a concurrent test run)."""
    mine, tests = os.getpid(), 0
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        tests += int(b"pytest" in cmd and int(proc.name) != mine)
    return {"utc": datetime.now(UTC).isoformat(timespec="seconds"), "load1": os.getloadavg()[0],
            "pytest_processes": tests}


def bench(ns: argparse.Namespace) -> dict:
    load_start, samples = os.getloadavg(), [machine_load()]
    repeats: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="braid-engine-bench-") as tmp:
        model, workload, summary, record = build_workload(ns, Path(tmp))
        for r in range(ns.repeats):
            rep: dict[str, dict] = {}
            for e in rotation(ENGINES, r):
                samples.append({"before": f"repeat {r} {e}", **machine_load()})
                rep[e] = run_worker(e, ns, model, workload)
                tps = (f"N={n} {statistics.median(x['tokens_per_s'] for x in v):.0f} tok/s"
                       for n, v in rep[e]["sizes"].items())
                print(f"repeat {r} {e}: " + ", ".join(tps), flush=True)
            repeats.append(rep)
    load_end = os.getloadavg()
    samples.append(machine_load())
    result = {"provenance": provenance(Path(__file__), record, CONFIG, ",".join(ENGINES)), "sizes": ns.sizes,
              "repeats": ns.repeats, "quick": ns.quick,
              "workload": summary,
              "load_start": list(load_start), "load_end": list(load_end),
              "load_samples": samples, "measured_in_this_run": True,
              "shared": max(load_start[0], load_end[0]) > 1.5 or any(x["pytest_processes"] for x in samples)}
    result.update(summarise(repeats, ns.sizes))
    result["raw"] = repeats
    return result


def main(argv: list[str] | None = None) -> int:
    ap = RecordParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per N in each worker")
    ap.add_argument("--swaps", type=int, default=5)
    ap.add_argument("--sizes", default="64,256")
    ap.add_argument("--cap", type=int, default=192)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu", type=int, default=min(os.sched_getaffinity(0)))
    ap.add_argument("--quick", action="store_true", help=f"1 repeat, N=64 only, into {QUICK_OUT}")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    if ns.worker:
        print(MARK + json.dumps(worker(ns)), flush=True)
        return 0
    ns.sizes = [64] if ns.quick else [int(x) for x in ns.sizes.split(",")]
    ns.repeats = 1 if ns.quick else ns.repeats
    result = bench(ns)
    print(write_results(results_dir(ns.out, ns.quick), "engine", result, markdown, plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
