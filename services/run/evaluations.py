"""When a run scores its suites, and what it does with the scores (``services.run.suites``).

- **Warm start**: every suite, before the first step (``warm_start``); kept in
  ``recovery/warmstart_suites.json``, read back by a resumed trainer, whose policy is no longer the warm start.
- **Between steps** (``between_steps``): after the optimizer step to version v, each suite due by
  its ``every`` (``forgetting.due``) is scored on the SGS, on the learner's thread, before the
  learner takes its next step. The fleet is first offered version v (``offer_missing``: a workflow
  that syncs instances lazily would not have yet); each instance installs it once its running
  samples finish (they finish on the version they started with), and the orchestrator goes on
  filling the next buffer at v beside the evaluation's requests. What it costs: the learner waits
  for the evaluation (``suite_eval_s`` in the step's metrics row, kept out of both iterations'
  wall time), and the instances' drain to v. The scores go into the step's ``metrics.jsonl`` row
  (``suite_accuracy``, ``suite_stderr``: name -> value) with the forgetting flags
  (``forgetting``, ``suites_forgotten``).
- **End**: every suite on the final policy (``final``), flagged against the warm start again.

A flag (``services.run.forgetting``) is logged as a warning; with ``eval.stop_on_forgetting`` it
also sets ``stop``, and the learner ends the run after that step (its final evaluation and
``final/`` then hold that step's policy). ``summary`` is the summary.json part: each suite's
settings and its warm-start and final scores, the flags at the end (``forgetting``), those raised
between steps (read back from ``metrics.jsonl``, so a restarted trainer's earlier rows count) and
the seconds spent evaluating between steps.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from services.common.eval_config import HELDOUT
from services.run.evaluate import EvalResult
from services.run.forgetting import Forgetting, Score, due, flag_line, judge_all
from services.run.suites import Suite

log = logging.getLogger("braid.eval")
WARMSTART_FILE = "warmstart_suites.json"


def score_of(result: EvalResult) -> Score:
    return Score(result.accuracy, result.stderr, result.prompts)


class Evaluations:
    """The suite evaluations of one trainer (``held``: its ``HeldOut``, the runtime; see the module docstring)."""

    def __init__(self, held, run_dir: Path) -> None:
        self.held = held
        self.run_dir = run_dir
        self.before: dict[str, EvalResult] = {}
        self.stop: dict | None = None  # set by a flag under eval.stop_on_forgetting
        self.latest: dict[str, EvalResult] = {}  # the last evaluation between steps
        self.seconds = 0.0  # this trainer process's evaluations between steps (not RL time)

    @property
    def suites(self) -> list[Suite]:
        return self.held.suites

    def warm_start(self, resumed: bool) -> dict[str, EvalResult]:
        """Every suite on the warm start (the held-out split first): scored once, read back when resumed."""
        path = self.run_dir / "recovery" / WARMSTART_FILE
        if resumed and path.exists():
            self.before = {k: EvalResult(**v) for k, v in json.loads(path.read_text()).items()}
        else:
            self.before = {HELDOUT: self.held.evaluate("eval-warmstart")}  # an agentic run: its episodes only
            self.before |= {s.name: self.held.evaluate_suite(s, f"eval-warmstart-{s.name}") for s in self.suites[1:]}
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({k: r.to_json() for k, r in self.before.items()}) + "\n")
            tmp.replace(path)
        return self.before

    def between_steps(self, version: int, snapshot) -> dict:
        """Score the suites due after the step to ``version`` (``snapshot``: its weights on the
        transport); the metrics row's part, empty when none is due."""
        last = self.held.cfg.trainer.iterations
        chosen = [s for s in self.suites if due(s.every, version, last)]
        if not chosen:
            return {}
        t0 = time.time()
        self.held.publisher.offer_missing(version, snapshot)
        results = {s.name: self.held.evaluate_suite(s, f"eval-v{version}-{s.name}") for s in chosen}
        self.latest = results
        flags = self.judge(results, version)
        seconds = time.time() - t0
        self.seconds += seconds
        if flags and self.held.cfg.eval.stop_on_forgetting:
            self.stop = {"weight_version": version, "reason": "eval.stop_on_forgetting",
                         "suites": [f.suite for f in flags]}
            log.warning("eval.stop_on_forgetting: the run ends after the step to version %d", version)
        return {"suite_accuracy": {k: r.accuracy for k, r in results.items()},
                "suite_stderr": {k: r.stderr for k, r in results.items()},
                "suite_eval_s": seconds, "forgetting": [f.to_json() for f in flags], "suites_forgotten": len(flags)}

    def judge(self, results: dict[str, EvalResult], version: int) -> list[Forgetting]:
        """The flags of ``results`` against the warm start, each logged."""
        flags = judge_all({k: score_of(r) for k, r in self.before.items()},
                          {k: score_of(r) for k, r in results.items()}, self.held.cfg.eval.forgetting_se, version)
        for f in flags:
            log.warning(flag_line(f.to_json()))
        return flags

    def final(self) -> dict[str, EvalResult]:
        """Every suite on the final policy, the held-out split first; a suite scored between steps at this
        very version (a run stopped by the forgetting check) is not scored again: the same weights and
        seed give the same answers."""
        version = self.held.version
        again = {k: r for k, r in self.latest.items() if r.weight_version == version}
        after = {HELDOUT: again.get(HELDOUT) or self.held.evaluate("eval-final")}
        for s in self.suites[1:]:
            after[s.name] = again.get(s.name) or self.held.evaluate_suite(s, f"eval-final-{s.name}")
        return after

    def summary(self, after: dict[str, EvalResult], version: int) -> dict:
        """summary.json's part (see the module docstring)."""
        described = {s.name: s.describe() for s in self.suites}
        suites = {name: {**described.get(name, {}), "before": self.before[name].to_json(), "after": r.to_json()}
                  for name, r in after.items()}
        flags = self.judge(after, version)
        midrun, seconds = between_steps_record(self.run_dir / "metrics.jsonl")
        return {"suites": suites, "forgetting": [f.to_json() for f in flags], "suites_forgotten": len(flags),
                "forgetting_threshold_se": self.held.cfg.eval.forgetting_se, "forgetting_between_steps": midrun,
                "suite_eval_seconds": seconds, "stopped_early": self.stop}


def between_steps_record(metrics: Path) -> tuple[list[dict], float]:
    """(the flags raised between steps, the seconds those evaluations took), from ``metrics.jsonl``'s rows."""
    if not metrics.exists():
        return [], 0.0
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    return [f for row in rows for f in row.get("forgetting", [])], sum(row.get("suite_eval_s", 0.0) for row in rows)
