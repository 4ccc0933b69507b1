"""Benchmark: every ranker kind and baseline on the same MMLU-Pro split, side by side.

    .venv/bin/python bench/ranker.py [--data FILE] [--model NAME] [--quick]

1. Converts the MMLU-Pro CoT lengths file (``--data``, default ``../shared/data/mmlu-pro-cot/
   mmlu_pro_cot_lengths.jsonl.gz`` next to the repository) for one target model (``--model``,
   default Llama-3.1-8B-Instruct) into train/val/test (7:2:1 by prompt, seed 0; lengths in
   characters).
2. Trains every kind (``prompt_length``, ``tfidf_linear`` baselines; ``lightgbm``,
   ``transformer``; ``ensemble`` of the last two, its weight chosen on the validation split) on
   the train split, timing each, and evaluates on val and test (recall@20/10/5%, Spearman).
3. Picks the best kind on the **validation** split (recall@20%, then Spearman) and reports its
   **test** metrics; writes ``bench/results/ranker.json``, ``ranker.md``, ``ranker.png`` and
   ``ranker_test_estimates.jsonl`` (the test split annotated by the best ranker through
   ``ranker.train.annotate``: id, prompt, response_length, estimated_length).

A non-deployable reference row shows what the other 28 models' mean log length (known only
after running them) achieves on the same test prompts: a ceiling for "prompt difficulty".
``--quick``: a subsample (1,000 train / 300 val / 400 test prompts) and a lighter transformer
(one epoch, 48 tokens), same fields, under 5 minutes (about 2 on a quiet machine).
"""

from __future__ import annotations

import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report_io import RecordParser, provenance, provenance_line, results_dir  # noqa: E402
from ranker.base import create, load_ranker  # noqa: E402
from ranker.data import DataError, convert_mmlu, load_dataset  # noqa: E402
from ranker.metrics import evaluate  # noqa: E402
from ranker.models.ensemble import EnsembleRanker  # noqa: E402
from ranker.train import annotate  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared/data/mmlu-pro-cot/mmlu_pro_cot_lengths.jsonl.gz"
BASELINES = ("prompt_length", "tfidf_linear")
MODELS = ("lightgbm", "transformer")
METRICS = ("recall_at_20", "recall_at_10", "recall_at_5", "spearman")


def model_params(kind: str, quick: bool) -> dict:
    if kind == "transformer" and quick:
        return {"epochs": 1, "max_tokens": 48}
    return {}


def reference_other_models(src: Path, target: str, test_ids: list[str], test_lengths: np.ndarray) -> dict:
    """Mean log length of the other models on the test prompts (not deployable; a ceiling)."""
    by_id = {}
    with gzip.open(src, "rt") as fh:
        for line in fh:
            row = json.loads(line)
            others = [v for k, v in row["resp_chars"].items() if k != target and isinstance(v, int) and v > 0]
            by_id[str(row["question_id"])] = float(np.mean(np.log(others))) if others else 0.0
    return evaluate(np.array([by_id[i] for i in test_ids]), test_lengths)


def run_kind(kind: str, train, val, test, quick: bool) -> tuple[object, dict]:
    t0, c0 = time.perf_counter(), time.process_time()
    model = create(kind, **model_params(kind, quick)).fit(train.prompts, train.lengths, unit="characters",
                                                         source=train.source)
    train_s, train_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    t0 = time.perf_counter()
    pv, pt = model.predict(val.prompts), model.predict(test.prompts)
    pred_s = time.perf_counter() - t0
    row = {"val": evaluate(pv, val.lengths), "test": evaluate(pt, test.lengths), "train_s": round(train_s, 1),
           "train_cpu_s": round(train_cpu_s, 1), "predict_s": round(pred_s, 1), "params": model.params,
           "_val_pred": pv, "_test_pred": pt}
    print(f"{kind:>14}: train {train_s:6.1f}s  val r@20 {row['val']['recall_at_20']:.3f}  "
          f"test r@20 {row['test']['recall_at_20']:.3f}", flush=True)
    return model, row


def ensemble_row(models: dict, rows: dict, val, test) -> tuple[object, dict]:
    """lightgbm + transformer: weight of the transformer chosen on the validation split."""
    best = None
    for w in (0.25, 0.5, 0.75):
        ens = EnsembleRanker.from_members([models["lightgbm"], models["transformer"]], weights=[1 - w, w])
        logs = [np.log(rows[k]["_val_pred"]) for k in MODELS]
        pv = np.exp((1 - w) * logs[0] + w * logs[1])
        m = evaluate(pv, val.lengths)
        if best is None or (m["recall_at_20"], m["spearman"]) > (best[1]["recall_at_20"], best[1]["spearman"]):
            best = (ens, m, w)
    ens, m_val, w = best
    logs = [np.log(rows[k]["_test_pred"]) for k in MODELS]
    pt = np.exp((1 - w) * logs[0] + w * logs[1])
    row = {"val": m_val, "test": evaluate(pt, test.lengths),
           "train_s": round(rows["lightgbm"]["train_s"] + rows["transformer"]["train_s"], 1),
           "train_cpu_s": round(rows["lightgbm"]["train_cpu_s"] + rows["transformer"]["train_cpu_s"], 1),
           "predict_s": round(rows["lightgbm"]["predict_s"] + rows["transformer"]["predict_s"], 1),
           "params": ens.params, "_val_pred": None, "_test_pred": pt}
    print(f"{'ensemble':>14}: weight(transformer)={w}  val r@20 {m_val['recall_at_20']:.3f}  "
          f"test r@20 {row['test']['recall_at_20']:.3f}", flush=True)
    return ens, row


def write_markdown(path: Path, result: dict) -> None:
    lines = [
        f"# Output-length ranker: MMLU-Pro, target {result['target_model']} (lengths in {result['unit']})",
        "",
        *([provenance_line(result["provenance"]), ""] if "provenance" in result else []),
        (f"Split 7:2:1 by prompt (seed {result['seed']}): {result['n_train']} train / {result['n_val']} val / "
        f"{result['n_test']} test prompts{' (quick subsample)' if result['quick'] else ''}. "
        "Best kind chosen on the validation split; test metrics below. Wall times from a shared, noisy 2-core "
        "machine; CPU seconds (all threads) are less sensitive to the noise (quiet 2-core wall time ~ CPU s / 1.6)."),
        "",
        "| kind | role | test recall@20% | recall@10% | recall@5% | Spearman | val recall@20% | train s | train CPU s "
        "| predict s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, row in result["kinds"].items():
        role = "baseline" if kind in BASELINES else ("**best**" if kind == result["best_kind"] else "model")
        t = row["test"]
        lines.append(f"| {kind} | {role} | {t['recall_at_20']:.3f} | {t['recall_at_10']:.3f} | {t['recall_at_5']:.3f} "
                     f"| {t['spearman']:.3f} | {row['val']['recall_at_20']:.3f} | {row['train_s']} "
                     f"| {row['train_cpu_s']} | {row['predict_s']} |")
    ref = result["reference_other_models"]
    lines.append(f"| other models' mean log length | reference (not deployable) | {ref['recall_at_20']:.3f} | "
                 f"{ref['recall_at_10']:.3f} | {ref['recall_at_5']:.3f} | {ref['spearman']:.3f} | - | - | - | - |")
    lines += ["", (f"Target recall@20% >= 0.70: **{'met' if result['target_met'] else 'not met'}** "
              f"(best {result['recall_at_20']:.3f}); beats both baselines: **{result['beats_baselines']}**. "
              f"A random ranker scores about 0.20 / 0.10 / 0.05."), ""]
    path.write_text("\n".join(lines))


def write_plot(path: Path, result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [*result["kinds"], "other models (ref.)"]
    values = [[result["kinds"][k]["test"][m] for k in result["kinds"]] + [result["reference_other_models"][m]]
              for m in ("recall_at_20", "recall_at_10", "recall_at_5")]
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(9, 4))
    for i, (label, vals) in enumerate(zip(("recall@20%", "recall@10%", "recall@5%"), values, strict=True)):
        ax.bar(x + (i - 1) * 0.27, vals, 0.27, label=label)
    ax.axhline(0.70, color="k", ls="--", lw=1, label="target @20% (0.70)")
    ax.set_xticks(x, names, rotation=15)
    ax.set_ylim(0, 1)
    ax.set_ylabel("test recall")
    ax.set_title(f"Ranker recall of the longest outputs, {result['target_model']}")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = RecordParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="mmlu_pro_cot_lengths.jsonl.gz")
    ap.add_argument("--model", default="Meta-Llama-3_1-8B-Instruct", help="target model whose lengths to rank")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="subsample and a lighter transformer (< 5 min)")
    ap.add_argument("--out-dir", default=None, help="default bench/results (--quick: /tmp/braid-bench-quick)")
    ns = ap.parse_args(argv)
    src = Path(ns.data)
    if not src.is_file():
        print(f"bench/ranker.py: data file {src} not found (pass --data; it ships in ../shared/data/mmlu-pro-cot)",
              file=sys.stderr)
        return 2
    out = results_dir(ns.out_dir, ns.quick)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="braid-ranker-bench-"))
    try:
        convert_mmlu(src, work, model=ns.model, seed=ns.seed)
    except DataError as err:
        print(f"bench/ranker.py: {err}", file=sys.stderr)
        return 2
    train, val, test = (load_dataset(work / f"{s}.jsonl") for s in ("train", "val", "test"))
    if ns.quick:
        train, val, test = train.subset(range(1000)), val.subset(range(300)), test.subset(range(400))
    print(f"{ns.model}: {len(train)} train / {len(val)} val / {len(test)} test prompts", flush=True)

    models, rows = {}, {}
    for kind in BASELINES + MODELS:
        models[kind], rows[kind] = run_kind(kind, train, val, test, ns.quick)
    models["ensemble"], rows["ensemble"] = ensemble_row(models, rows, val, test)

    candidates = ("lightgbm", "transformer", "ensemble")
    best = max(candidates, key=lambda k: (rows[k]["val"]["recall_at_20"], rows[k]["val"]["spearman"]))
    best_dir = work / "best_ranker"
    models[best].save(best_dir)
    test_file = work / "test_selected.jsonl"
    test_file.write_text("".join(json.dumps({"id": e.id, "prompt": e.prompt, "response_length": e.response_length})
                                 + "\n" for e in test.examples))
    annotate(load_ranker(best_dir), test_file, out / "ranker_test_estimates.jsonl")

    kinds = {k: {key: v for key, v in r.items() if not key.startswith("_")} for k, r in rows.items()}
    bt = kinds[best]["test"]
    result = {
        "provenance": provenance(Path(__file__), {"data": str(src), "model": ns.model, "seed": ns.seed,
                                                  "quick": ns.quick}, inputs=[src]),
        "best_kind": best, **{m: bt[m] for m in METRICS},
        "baselines": {k: {m: kinds[k]["test"][m] for m in METRICS} for k in BASELINES},
        "kinds": kinds,
        "reference_other_models": reference_other_models(src, ns.model, [e.id for e in test.examples], test.lengths),
        "target_model": ns.model, "unit": "characters", "seed": ns.seed, "quick": ns.quick,
        "n_train": len(train), "n_val": len(val), "n_test": len(test),
        "target_met": bt["recall_at_20"] >= 0.70,
        "beats_baselines": all(bt["recall_at_20"] > kinds[k]["test"]["recall_at_20"] for k in BASELINES),
        "selection": "best kind by validation recall@20% (ties: Spearman) among lightgbm, transformer, ensemble",
        "estimates_file": "bench/results/ranker_test_estimates.jsonl",
    }
    previous = json.loads((out / "ranker.json").read_text()) if (out / "ranker.json").is_file() else {}
    result.update({k: v for k, v in previous.items() if k.startswith("policy_own")})  # bench/ranker_own.py's part
    (out / "ranker.json").write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(out / "ranker.md", result)
    write_plot(out / "ranker.png", result)
    print((out / "ranker.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
