"""Online adaptation of the output-length ranker inside a run (StreamRL §5.2).

As the policy trains, its output lengths drift, and a ranker trained on another model's (or an
earlier policy's) lengths ranks them worse. With ``generation.retrain.every = N`` the
``rl_training`` flow retrains the ranker on the run's own generation log (``generation.genlog``)
every N iterations while the run goes on: the ``retrain_ranker`` flow (read the log's newest
samples, train, compare with the current ranker on the newest held-out prompts, publish into
``generation.ranker_dir``), called on a thread of its own (the run's Prefect context copied to
it), so the run's supervision never waits for it. The orchestrator's ``RankerWatcher`` picks the
new version up at its next routing round, no restart; each metrics row names the ranker version
its groups were placed with (``ranker_version``), so the report shows when a swap took effect.

Every retrain appends one row to ``ranker_retrains.jsonl`` in the run directory — the iteration it
started at, its data sizes, recall@20% of the current and the new ranker on the same held-out
samples, the version published, how long it took — or the reason it did not publish (a log still
too small: it tries again N iterations later). A failing retrain never stops the run: the run goes
on with the ranker it has, and the row says why. ``causal_lm`` rankers default to the run's own
policy checkpoint as their base (StreamRL fine-tunes the policy's base model).
"""

from __future__ import annotations

import contextvars
import json
import threading
import time
from pathlib import Path
from typing import Any

RETRAINS = "ranker_retrains.jsonl"


def retrain_params(cfg, run_dir: Path, checkpoint: str, iteration: int) -> dict[str, Any]:
    """The ``RetrainParams`` fields of the retrain that starts at ``iteration`` (pure)."""
    r, gen = cfg.generation.retrain, cfg.generation
    model_params = dict(r.params)
    if r.kind == "causal_lm":
        model_params.setdefault("base_path", checkpoint)
    return {"log_path": gen.genlog, "store_root": gen.ranker_dir, "n_recent": r.n_recent, "kind": r.kind,
            "holdout_fraction": r.holdout_fraction, "min_samples": r.min_samples, "model_params": model_params,
            "work_dir": str(run_dir / "ranker-retrains" / f"it{iteration:06d}")}


def next_due(done: int, every: int) -> int:
    """The iteration count at which the retrain after ``done`` completed iterations is due (pure)."""
    return (done // every + 1) * every


def read_retrains(run_dir: Path) -> list[dict]:
    path = run_dir / RETRAINS
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


class OnlineRetrainer:
    """Called with the completed iteration count on every poll of a running run; starts a retrain
    when one is due and none is running (one at a time: a slow kind delays the next, never piles up)."""

    def __init__(self, run_dir: Path, cfg, checkpoint: str, retrain=None) -> None:
        self.run_dir, self.cfg, self.checkpoint = run_dir, cfg, checkpoint
        self.every = cfg.generation.retrain.every
        self.due = self.every
        self._retrain = retrain  # the flow to call (tests inject one); default: flows.retrain_ranker
        self._thread: threading.Thread | None = None

    def __call__(self, done: int) -> None:
        if not self.every or done < self.due or (self._thread is not None and self._thread.is_alive()):
            return
        self.due = next_due(done, self.every)
        ctx = contextvars.copy_context()  # the run's Prefect context (its flow run) on the thread
        self._thread = threading.Thread(target=ctx.run, args=(self._run, done), name="ranker-retrain", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 600.0) -> None:
        """Wait for a retrain in progress (its row is written before the report reads them)."""
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self, iteration: int) -> None:
        t0 = time.time()
        row: dict[str, Any] = {"iteration": iteration, "started_at": t0}
        try:
            from flows.retrain_ranker import RetrainParams, retrain_ranker

            fn = self._retrain or retrain_ranker
            result = fn(RetrainParams(**retrain_params(self.cfg, self.run_dir, self.checkpoint, iteration)))
            before, after = result.get("before") or {}, result.get("after") or {}
            row.update(published=result["published"], previous=result["previous"], n_train=result["n_train"],
                       n_holdout=result["n_holdout"], recall_before=before.get("recall_at_20"),
                       recall_after=after.get("recall_at_20"), published_at=time.time())
        except Exception as err:  # noqa: BLE001 -- recover: the run keeps its ranker; the row says why
            row["error"] = f"{type(err).__name__}: {err}"
        row["seconds"] = round(time.time() - t0, 2)
        with (self.run_dir / RETRAINS).open("a") as f:
            f.write(json.dumps(row) + "\n")


def swaps(retrains: list[dict], rows: list[dict]) -> list[tuple[int, float | None] | None]:
    """Per retrain, the first iteration by whose end the orchestrator dispatched with the version it
    published (``ranker_version`` of the metrics rows) and the seconds from publishing to that end
    (an upper bound on the swap time; None without timestamps); None when it never did (pure)."""
    out: list[tuple[int, float | None] | None] = []
    for r in retrains:
        name = r.get("published")
        row = next((x for x in rows if name and x.get("ranker_version") == name), None)
        if row is None:
            out.append(None)
            continue
        t_end, published_at = row.get("t_end"), r.get("published_at")
        out.append((row["iteration"],
                    None if t_end is None or published_at is None else round(t_end - published_at, 2)))
    return out


def report_lines(run_dir: Path, rows: list[dict]) -> list[str]:
    """The report's section on the online retrains (nothing when the run had none)."""
    retrains = read_retrains(run_dir)
    if not retrains:
        return []
    lines = ["", "## Online ranker retrains", "",
             "| at iteration | trained on / held out | recall@20% current → new | published | retrain s "
             "| in use by the end of iteration (s after publishing) |",
             "|---|---|---|---|---|---|"]
    for r, live in zip(retrains, swaps(retrains, rows), strict=True):
        if "error" in r:
            lines.append(f"| {r['iteration']} | - | - | not retrained: {r['error']} | {r['seconds']} | - |")
            continue
        before = "none" if r["recall_before"] is None else f"{r['recall_before']:.3f}"
        used = "-" if live is None else f"{live[0]}" + ("" if live[1] is None else f" ({live[1]:.1f} s)")
        lines.append(f"| {r['iteration']} | {r['n_train']} / {r['n_holdout']} | {before} → {r['recall_after']:.3f} | "
                     f"{r['published'] or 'no (not better)'} | {r['seconds']} | {used} |")
    return lines
