"""Trainer benchmark: data-parallel ranks (FSDP2 over gloo) against one process, side by side.

The learner alone (no generation): the same GRPO batches of arith-task samples (the task's
prompts, its long-tail response lengths, random tokens, rewards 0/1 within each group so every
group trains) for 1 rank on 1 core and 2 ranks on 2 cores, one torch thread each, interleaved
(dp1, dp2, dp2, dp1, ...). Per variant: training tokens/s (prompt + response tokens trained per
second of ``begin``/``backward``/``step``) over the timed steps; the ratio is taken per round.

Weight push from the sharded model, as the relay transport makes it: rank 0 draws
``Learner.weights()`` (each tensor all-gathered as it is drawn) straight into the version's
snapshot blob in ``/dev/shm`` (the one the master relay adopts in place on this host), the other
ranks draw and drop. Per rank: the peak heap in use above its level before the push (glibc's
``mallinfo2``, sampled while each gathered tensor is alive) plus the snapshot blob it wrote, as a
fraction of the model's float32 size. Rank 0 holds one full copy (the snapshot itself, about 1.0),
never a second; the other ranks one gathered tensor at a time.

Writes ``bench/results/train.json``, ``.md`` and ``.png``; ``--quick`` writes to a scratch directory.

    python bench/train.py [--repeats 3] [--steps 4] [--sizes default,small] [--quick]
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report_io import (  # noqa: E402
    RecordParser,
    provenance,
    provenance_line,
    ratio_spread,
    results_dir,
    spread,
    write_results,
)

# model sizes: the default config's tiny policy, and a larger one where compute outweighs the collectives
SIZES = {
    "default": {},
    "small": {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 768},
}
CONFIG = ROOT / "deploy/configs/default.yaml"
RESPONSE_CAP = 192


def batch(cfg, policy, seed: int) -> list:
    """One iteration's groups: the task's prompts and response lengths, random response tokens."""
    from services.common.types import SampleRecord
    from services.tasks.arith import ProblemSampler, demonstration
    from services.trainer.learner import Group

    rng, tc = random.Random(seed), cfg.trainer
    vocab = policy.model.config.vocab_size
    groups = []
    for p in ProblemSampler(seed, **cfg.task.distribution()).batch(tc.prompts_per_iteration):
        prompt = tuple(policy.encode_prompt(p.prompt))
        base = len(demonstration(p)) + 1
        recs = []
        for i in range(tc.group_size):
            n = min(RESPONSE_CAP, max(1, base + rng.randint(-2, 2)))
            recs.append(SampleRecord(p.prompt_id, p.prompt_id, i, prompt,
                                     tuple(rng.randrange(4, vocab) for _ in range(n)),
                                     tuple([-2.5] * n), 0, "stop", 0.0, 0.0, 0.0))
        groups.append(Group(recs, [float(i % 2) for i in range(tc.group_size)]))
    return groups


def heap_in_use() -> int:
    """Bytes malloc has handed out and not taken back (glibc ``mallinfo2``: arena + mmapped
    blocks): torch's CPU tensors included, unlike resident memory, which freed-and-reused
    pages hide."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


def measured_push(learner, leader: bool) -> int:
    """Peak bytes a weight push adds on this rank: heap above its level before the push, sampled
    while each drawn tensor is alive, plus the shared-memory snapshot blob (rank 0 only)."""
    from services.weights.blob import private_shm_dir
    from services.weights.values import snapshot_blob

    base, peak = heap_in_use(), [0]
    stream = learner.weights()
    drawn = stream.tensors

    def observed():
        for item in drawn:
            yield item
            peak[0] = max(peak[0], heap_in_use() - base)

    stream.tensors = observed()
    if not leader:
        for _ in stream.tensors:
            pass
        return peak[0]
    shm = private_shm_dir("bench-train")
    try:
        snap = snapshot_blob(stream, 1 << 20, shm)
        peak[0] = max(peak[0], heap_in_use() - base)
        blob_bytes = snap.blob.size
        snap.blob.release()
    finally:
        import shutil

        shutil.rmtree(shm, ignore_errors=True)
    return peak[0] + blob_bytes


def worker(rank: int, world: int, port: int, size: str, steps: int, out: str) -> None:
    """One rank (or the single process): timed learner steps, then a measured gather."""
    import torch

    os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    torch.set_num_threads(1)
    from services.common.config import load_config
    from services.policy.model import build_policy
    from services.trainer.learner import Learner
    from services.trainer.parallel import Leader, context_from_env, follow, init_process_group, shutdown

    cfg = load_config(CONFIG, [f"model.{k}={v}" for k, v in SIZES[size].items()] + [f"trainer.ranks={world}"])
    ctx = None
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
        ctx = context_from_env()
        init_process_group(ctx, torch.device("cpu"))
    torch.manual_seed(0)
    policy = build_policy(cfg.model)
    model_bytes = sum(p.numel() * 4 for p in policy.model.parameters())
    learner = Learner(cfg, policy, ctx)
    if ctx is not None and not ctx.leader:
        follow(learner, ctx)
        peak = measured_push(learner, leader=False)  # after the leader's stop both ranks call it directly
        Path(out).with_suffix(f".rank{rank}.json").write_text(json.dumps({"push_peak_bytes": peak,
                                                                          "model_bytes": model_bytes}))
        shutdown()  # exits
    lead = learner if ctx is None else Leader(learner, ctx)
    groups = [batch(cfg, policy, seed) for seed in range(steps + 1)]
    tokens, seconds = 0, 0.0
    for k, g in enumerate(groups):
        t0 = time.perf_counter()
        lead.begin()
        for i in range(0, len(g), cfg.trainer.micro_batch_groups):
            lead.backward(g[i:i + cfg.trainer.micro_batch_groups])
        lead.step()
        if k:  # step 0 warms up (allocations, FSDP's lazy init)
            seconds += time.perf_counter() - t0
            tokens += sum(len(s.prompt_token_ids) + len(s.token_ids) for grp in g for s in grp.samples)
    if ctx is not None:
        lead.close()
    peak = measured_push(learner, leader=True)
    Path(out).with_suffix(f".rank{rank}.json").write_text(json.dumps(
        {"tokens_per_s": tokens / seconds, "tokens": tokens, "seconds": seconds, "push_peak_bytes": peak,
         "model_bytes": model_bytes}))
    shutdown()


def run_variant(world: int, size: str, steps: int) -> dict:
    """Start ``world`` worker processes (spawned), wait, and read their records."""
    import torch.multiprocessing as mp

    from flows.processes import free_port

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="braid-bench-train-") as tmp:
        out = Path(tmp) / "result"
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=worker, args=(r, world, port, size, steps, str(out))) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=1800)
            if p.exitcode != 0:
                raise RuntimeError(f"dp{world} {size}: a rank exited with {p.exitcode}")
        ranks = [json.loads(out.with_suffix(f".rank{r}.json").read_text()) for r in range(world)]
    return {**ranks[0], "push_peak_fraction": [r["push_peak_bytes"] / r["model_bytes"] for r in ranks]}


def summarise(runs: dict[str, dict[int, list[dict]]]) -> dict:
    """Per size: tokens/s of each variant, the per-round ratio dp2/dp1, push peaks per rank."""
    sizes = {}
    for size, by_world in runs.items():
        dp1, dp2 = by_world[1], by_world[2]
        sizes[size] = {
            "model_bytes": dp1[0]["model_bytes"],
            "dp1_tokens_per_s": spread([r["tokens_per_s"] for r in dp1]),
            "dp2_tokens_per_s": spread([r["tokens_per_s"] for r in dp2]),
            "dp2_vs_dp1": ratio_spread([r["tokens_per_s"] for r in dp2], [r["tokens_per_s"] for r in dp1]),
            "push_peak_fraction": {f"rank{k}": spread([r["push_peak_fraction"][k] for r in dp2]) for k in range(2)},
            "single_process_push_fraction": spread([r["push_peak_fraction"][0] for r in dp1]),
        }
    return sizes


def markdown(result: dict) -> str:
    p = result["provenance"]
    lines = ["# Trainer: 2 data-parallel ranks (FSDP2, gloo) vs 1 process", "", provenance_line(p), "",
             f"Learner alone on the default task's batches ({result['samples_per_step']} samples per step, "
             f"{result['steps']} timed steps after one warm-up), one torch thread per process, rank r pinned to CPU r; "
             f"{result['repeats']} interleaved rounds, median [min–max].", "",
             "| model | float32 size | dp1 tokens/s | dp2 tokens/s | **dp2 / dp1** (per round) | push peak rank 0 "
             "| push peak rank 1 |",
             "|---|---|---|---|---|---|---|"]
    for size, r in result["sizes"].items():
        def f(s: dict, spec: str = ".0f") -> str:
            return f"{s['median']:{spec}} [{s['min']:{spec}}–{s['max']:{spec}}]"
        pk = r["push_peak_fraction"]
        lines.append(f"| {size} | {r['model_bytes'] / 2**20:.1f} MiB | {f(r['dp1_tokens_per_s'])} "
                     f"| {f(r['dp2_tokens_per_s'])} | **{f(r['dp2_vs_dp1'], '.2f')}x** | {f(pk['rank0'], '.2f')} "
                     f"| {f(pk['rank1'], '.2f')} |")
    lines += ["", "*push peak*: what a weight push through the relay transport adds on a rank, as a fraction of the "
              "model's float32 size: the peak heap in use above its level before the push (glibc `mallinfo2`, sampled "
              "while each gathered tensor is alive) plus the snapshot blob in `/dev/shm` that rank 0 draws "
              "`Learner.weights()` into, tensor by tensor (the blob the master relay adopts in place). Rank 0 holds "
              "that one full copy and no second; the other ranks one gathered tensor at a time.",
              ""]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(result["sizes"])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for j, (key, label) in enumerate((("dp1_tokens_per_s", "1 process"), ("dp2_tokens_per_s", "2 ranks (FSDP2)"))):
        med = [result["sizes"][s][key]["median"] for s in sizes]
        lo = [m - result["sizes"][s][key]["min"] for m, s in zip(med, sizes, strict=True)]
        hi = [result["sizes"][s][key]["max"] - m for m, s in zip(med, sizes, strict=True)]
        ax.bar([i + 0.4 * j for i in range(len(sizes))], med, 0.4, yerr=[lo, hi], label=label, capsize=3)
    ax.set_xticks([i + 0.2 for i in range(len(sizes))], sizes)
    ax.set_ylabel("training tokens/s")
    ax.set_title("Learner throughput, 2 cores")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = RecordParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4, help="timed steps per run (after one warm-up step)")
    ap.add_argument("--sizes", default="default,small", help=f"comma-separated of {sorted(SIZES)}")
    ap.add_argument("--quick", action="store_true",
                    help="1 round, 2 steps, default size; writes to /tmp/braid-bench-quick")
    ap.add_argument("--out", default=None)
    ns = ap.parse_args()
    sizes = ["default"] if ns.quick else [s.strip() for s in ns.sizes.split(",") if s.strip()]
    if unknown := [s for s in sizes if s not in SIZES]:
        ap.error(f"unknown sizes {unknown}; known: {sorted(SIZES)}")
    repeats, steps = (1, 2) if ns.quick else (ns.repeats, ns.steps)
    runs: dict[str, dict[int, list[dict]]] = {s: {1: [], 2: []} for s in sizes}
    for r in range(repeats):
        for size in sizes:
            for world in ((1, 2) if r % 2 == 0 else (2, 1)):  # interleaved: dp1 dp2 | dp2 dp1 | ...
                rec = run_variant(world, size, steps)
                runs[size][world].append(rec)
                print(f"round {r} {size} dp{world}: {rec['tokens_per_s']:.0f} tokens/s, push peak "
                      f"{', '.join(f'{x:.2f}' for x in rec['push_peak_fraction'])} of the model", flush=True)
    from services.common.config import load_config

    cfg = load_config(CONFIG)
    result = {
        "provenance": provenance(Path(__file__), {"sizes": {s: SIZES[s] for s in sizes}, "steps": steps},
                                 CONFIG, cfg.generation.engine),
        "repeats": repeats, "steps": steps, "quick": ns.quick,
        "samples_per_step": cfg.trainer.prompts_per_iteration * cfg.trainer.group_size,
        "sizes": summarise(runs), "raw": runs,
    }
    head = result["sizes"]["default" if "default" in sizes else sizes[0]]
    result["dp2_vs_dp1_train_tokens_per_s"] = head["dp2_vs_dp1"]["median"]
    result["push_peak_mem_fraction"] = max(v["median"]
                                           for v in result["sizes"][sizes[-1]]["push_peak_fraction"].values())
    out = str(results_dir(ns.out, ns.quick))
    print(write_results(out, "train", result, markdown, plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
