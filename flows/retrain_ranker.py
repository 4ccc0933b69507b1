"""Prefect flow ``retrain_ranker``: online adaptation of the output-length ranker (StreamRL §5.2).

As the policy trains, its output lengths drift; StreamRL periodically fine-tunes the ranker on
recently generated samples. This flow wires the steps and passes paths only:

1. ``read-log``: the N most recent finished samples of the SGS generation log (lengths in
   tokens). The newest ``holdout_fraction`` of them (by prompt: every sample of a held-out
   prompt is held out, so GRPO groups never straddle the split) become the held-out set; the
   rest is the training set. Both are written as ranker JSONL into the work directory.
2. ``train``: a ranker of ``kind`` on the training set.
3. ``evaluate``: the store's current ranker (if any) and the new one on the same held-out set.
4. ``publish``: the new ranker into the ``RankerStore`` (atomic ``CURRENT`` switch), unless
   ``require_improvement`` is set and it is worse than the current one on recall@20%; every SGS
   holding a ``RankerWatcher`` on the store picks it up on its next ``get()``, no restart.
5. a table artifact with before/after metrics.

A log with fewer than ``min_samples`` rows (or too few distinct prompts to hold some out)
fails the flow with a message naming the log and the counts.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from pydantic import Field

from services.common.config import StrictModel

# What a run of deploy/configs/skewness.yaml writes and reads (generation.genlog, generation.ranker_dir),
# relative to the directory the flow runs in: the repository root for `braid run` and for the workers
# `make server` starts. A unit test keeps them equal to the config's.
DEFAULT_LOG_PATH = "runs/generation-log.sqlite"
DEFAULT_STORE_ROOT = "runs/rankers"
KindName = Literal["lightgbm", "transformer", "causal_lm", "ensemble", "tfidf_linear", "prompt_length"]
METRIC_KEYS = ("n", "recall_at_20", "recall_at_10", "recall_at_5", "spearman")


class RetrainParams(StrictModel):
    """Parameters of one ranker retraining (rendered as a form in the Prefect UI)."""

    log_path: str = Field(DEFAULT_LOG_PATH, description="Path of the SGS generation log (SQLite) to learn from; "
                          "default: the one a deploy/configs/skewness.yaml run writes (generation.genlog).")
    store_root: str = Field(DEFAULT_STORE_ROOT, description="Ranker store directory (CURRENT pointer + published "
                            "rankers) the SGS watches; default: deploy/configs/skewness.yaml's generation.ranker_dir.")
    n_recent: int = Field(20_000, ge=20, le=10_000_000, description="Train on the N most recent finished samples.")
    kind: KindName = Field("lightgbm", description="Model kind to train.")
    holdout_fraction: float = Field(0.1, gt=0.0, le=0.5,
                                    description="Newest fraction of the samples held out to compare old and new "
                                    "ranker.")
    min_samples: int = Field(50, ge=10, le=10_000_000, description="Fewest log samples needed to retrain.")
    require_improvement: bool = Field(False, description="Publish only if the new ranker's recall@20% >= the current "
                                      "one's.")
    model_params: dict[str, Any] = Field(default_factory=dict, description="Keyword parameters of the model kind.")
    work_dir: str | None = Field(None, description="Where to write the data splits and the new ranker (default: a "
                                 "temp dir).")


@task(name="read-log")
def read_log(log_path: str, n_recent: int, holdout_fraction: float, min_samples: int, work_dir: str) -> dict[str, Any]:
    from ranker.data import examples_from_log, examples_to_rows, write_jsonl
    from ranker.train import write_unit

    if not Path(log_path).is_file():
        raise ValueError(f"{log_path}: no such generation log (relative to {Path.cwd()}); a run writes one with "
                         "generation.genlog set, as `braid run --config deploy/configs/skewness.yaml` does")
    examples = examples_from_log(log_path, n_recent)
    if len(examples) < min_samples:
        raise ValueError(f"{log_path}: generation log has {len(examples)} finished samples, "
                         f"retraining needs at least min_samples={min_samples}")
    n_hold = max(1, round(holdout_fraction * len(examples)))
    held = {e.prompt for e in examples[-n_hold:]}  # the newest samples' prompts, every sample of them
    train = [e for e in examples if e.prompt not in held]
    hold = [e for e in examples if e.prompt in held]
    if len(train) < max(2, min_samples // 2) or len(hold) < 2:
        raise ValueError(f"{log_path}: {len(examples)} samples over {len({e.prompt for e in examples})} prompts "
                         f"leave {len(train)} for training and {len(hold)} held out; need more distinct prompts")
    out = Path(work_dir)
    write_jsonl(out / "train.jsonl", examples_to_rows(train))
    write_jsonl(out / "holdout.jsonl", examples_to_rows(hold))
    for name in ("train.jsonl", "holdout.jsonl"):
        write_unit(out / name, "tokens")  # the generation log counts tokens
    return {"train": str(out / "train.jsonl"), "holdout": str(out / "holdout.jsonl"),
            "n_train": len(train), "n_holdout": len(hold)}


@task(name="train")
def train_step(train_path: str, out_dir: str, kind: str, model_params: dict[str, Any]) -> str:
    from ranker.train import train

    train(train_path, out_dir, kind=kind, params=model_params, unit="tokens")
    return out_dir


@task(name="evaluate")
def evaluate_step(ranker_dir: str | None, holdout_path: str, tolerate_broken: bool = False) -> dict[str, Any] | None:
    """Metrics of a ranker on the held-out file; None without a ranker (or an unreadable current one)."""
    if ranker_dir is None:
        return None
    from ranker.base import RankerFormatError, load_ranker
    from ranker.train import evaluate_ranker, unit_mismatch

    try:
        model = load_ranker(ranker_dir)
    except RankerFormatError as err:
        if not tolerate_broken:
            raise
        get_run_logger().warning("current ranker unreadable, replacing it: %s", err)  # recover: publish a good one
        return None
    result = evaluate_ranker(model, holdout_path)
    warning = unit_mismatch(result)
    if warning:
        get_run_logger().warning("ranker %s: %s", ranker_dir, warning)
    return result


@task(name="publish")
def publish_step(store_root: str, ranker_dir: str) -> str:
    from ranker.store import RankerStore

    return RankerStore(store_root).publish(ranker_dir)


def _row(name: str, metrics: dict[str, Any] | None, where: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {"ranker": name, "where": where or "-", "kind": (metrics or {}).get("kind", "-")}
    row.update({k: (metrics or {}).get(k, "-") for k in METRIC_KEYS})
    return row


@flow(name="retrain_ranker", log_prints=True)
def retrain_ranker(params: RetrainParams | None = None) -> dict[str, Any]:
    """Retrain the output-length ranker on recent generations and hot-swap it into the store.

    Args:
        params: What to learn from and where to publish; empty: every default (the generation log and
            the ranker store of a deploy/configs/skewness.yaml run, runs/generation-log.sqlite and runs/rankers).
    """
    from prefect.artifacts import create_table_artifact

    from ranker.store import RankerStore

    params = params or RetrainParams()
    logger = get_run_logger()
    work = Path(params.work_dir or tempfile.mkdtemp(prefix="braid-retrain-"))
    work.mkdir(parents=True, exist_ok=True)
    split = read_log(params.log_path, params.n_recent, params.holdout_fraction, params.min_samples, str(work))
    current = RankerStore(params.store_root).current()
    new_dir = train_step(split["train"], str(work / "ranker"), params.kind, params.model_params)
    before = evaluate_step(str(current) if current else None, split["holdout"], tolerate_broken=True)
    after = evaluate_step(new_dir, split["holdout"])
    better = before is None or after["recall_at_20"] >= before["recall_at_20"]
    published = publish_step(params.store_root, new_dir) if better or not params.require_improvement else None
    logger.info("ranker retrained on %d samples: recall@20 %s -> %s; published %s", split["n_train"],
                before and before["recall_at_20"], after["recall_at_20"], published)
    create_table_artifact(
        table=[_row("current (before)", before, current.name if current else None),
               _row("new (after)", after, published)],
        key="ranker-retrain",
        description=(f"Ranker retrained on {split['n_train']} recent samples of {params.log_path}; "
                     f"held-out: {split['n_holdout']} newest samples. Published: {published or 'no (not better)'}"),
    )
    return {"published": published, "before": before, "after": after, "previous": current.name if current else None,
            "n_train": split["n_train"], "n_holdout": split["n_holdout"], "work_dir": str(work)}
