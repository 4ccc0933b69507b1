"""The run-signals benchmark's pieces: the trace export from a generation log, and the estimators'
scoring on a synthetic multi-visit trace (bench/run_signals_trace.py, bench/run_signals_eval.py)."""

from __future__ import annotations

import gzip
import json
import math
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import run_signals_eval as ev  # noqa: E402
import run_signals_trace as tr  # noqa: E402

from ranker.genlog import GenerationLog, GenRecord  # noqa: E402


def _trace(prompts: int = 60, visits: int = 3, size: int = 8, seed: int = 0) -> list[dict]:
    """Questions with lasting length levels that the text only hints at (its length, weakly)."""
    rng = random.Random(seed)
    level = [rng.gauss(5.0, 0.5) for _ in range(prompts)]
    text = [("x" * max(1, round(20 * math.exp(m + rng.gauss(0, 1.0)) / 150))) + f" q{i}" for i, m in enumerate(level)]
    out = []
    for v in range(visits):
        for i in rng.sample(range(prompts), prompts):
            lengths = sorted(max(1, round(math.exp(rng.gauss(level[i], 0.5)))) for _ in range(size))
            out.append({"prompt": text[i], "visit": v, "version": v, "lengths": lengths})
    return out


def test_the_run_signals_rank_makespans_better_than_the_text_alone():
    groups = _trace()
    r = ev.evaluate(groups, {**ev.DECLARED, "folds": 3})
    for kind in ev.KINDS:
        rows = r[kind]
        assert set(rows) == set(ev.ESTIMATORS) and set(rows["both"]["per_visit"]) == {"0", "1", "2"}
        assert rows["history"]["recall_at_20"] > rows["text"]["recall_at_20"]
        assert rows["both"]["kendall_tau"] > rows["text"]["kendall_tau"]
        assert rows["both"]["recall_at_20"] >= rows["siblings"]["recall_at_20"]


def test_load_refuses_a_row_that_is_not_a_group(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(json.dumps({"prompt": "q", "visit": 0, "lengths": [3, 0]}) + "\n")
    with pytest.raises(SystemExit, match="row 0"):
        ev.load(path)


def test_export_numbers_the_visits_of_each_prompt_and_drops_partial_groups(tmp_path):
    log = GenerationLog(tmp_path / "g.sqlite")
    rows = []
    t = 0.0
    for pid, prompt, n, version in (("p0", "A", 2, 0), ("p1", "B", 2, 0), ("p2", "A", 2, 3), ("p3", "B", 1, 3),
                                    ("p4/0#0", "B", 1, 4), ("p4/1#0", "B", 1, 4), ("p5", "A", 2, 5)):
        for k in range(n):
            t += 1.0
            rows.append(GenRecord(pid, prompt, 10 * (k + 1) + version, version, 0, t))
    log.append(rows)
    log.close()
    out = tr.export(tmp_path / "g.sqlite", group_size=2)
    # p3 (B's second draw) did not finish whole: left out, but B's next draw is its third visit; p4's samples
    # were resumed one by one on another instance (``p4/<sample>#<attempt>``) and are still one group
    assert [(g["prompt"], g["visit"], g["version"]) for g in out] == [("A", 0, 0), ("B", 0, 0), ("A", 1, 3),
                                                                      ("B", 2, 4), ("A", 2, 5)]
    assert out[2]["lengths"] == [13, 23] and out[3]["lengths"] == [14, 14]  # in finishing order
    sets = tr.overrides(tr.QUICK, tmp_path / "train.jsonl", tmp_path / "heldout.jsonl", tmp_path / "run")
    assert "trainer.iterations=4" in sets and "trainer.group_size=4" in sets


def test_recall_with_ties_counts_every_group_tied_at_the_cap_as_in_the_tail():
    true = [1024, 1024, 1024, 300, 200, 100, 90, 80, 70, 60]  # three tied at the cap; the top fifth is two
    late = [0, 0, 0, 5, 4, 3, 2, 1, 1, 1]
    picks_third_tied = [0.0, 0.1, 9.0, 8.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # the cap's third group and a 300
    assert ev.recall_at(picks_third_tied, true, 0.2) == 0.0  # StreamRL's: the tail is the first two by position
    assert ev.recall_with_ties(picks_third_tied, true, 0.2) == 0.5
    assert ev.recall_with_ties([float(x) for x in true], true, 0.2) == 1.0
    assert ev.recall_with_ties(late, true, 0.2) == 0.0
    assert ev.random_with_ties(true, 0.2) == 0.3  # three of ten in the tail with its ties: a random pick's chance
    assert ev.random_with_ties(list(range(10)), 0.2) == 0.2
    assert ev.goal_met(0.75, 0.3) is True and ev.goal_met(0.5, 0.3) is False
    assert ev.goal_met(1.0, 1.0) is None and ev.goal_met(None, 0.3) is None  # chance reaches it: not judged


def test_the_fleet_workload_is_a_dataset_of_the_trace_and_a_replay_with_each_prompts_estimate(tmp_path):
    import fleet_run_signals as frs

    from services.common.config import load_config
    from services.rollout.length_replay import VisitReplay

    trace = _trace(prompts=12, visits=2, size=4)
    priors = {g["prompt"]: 100.0 + k for k, g in enumerate(trace)}
    w = frs.workload(trace, priors, tmp_path / "w")
    assert (w["prompts"], w["visits"], w["group_size"]) == (12, 2, 4)
    texts = [json.loads(x)["question"] for x in w["train"].read_text().splitlines()]
    assert sorted(texts) == sorted({g["prompt"] for g in trace})
    replay = VisitReplay.load(w["replay"], cap=w["cap"], mode="recorded")
    assert replay.estimates == {p: round(v, 3) for p, v in priors.items()}
    for variant in ("least_loaded", "alg2+lpt+run_signals", "alg2+lpt+oracle"):
        cfg = load_config(frs.fd.CONFIG, frs.overrides(w, variant, 2, 4, 0.25, tmp_path / "runs" / variant))
        assert cfg.task.kind == "dataset" and cfg.task.seed == 2 and cfg.trainer.mode == "sync"
        assert (cfg.trainer.prompts_per_iteration, cfg.trainer.iterations, cfg.trainer.group_size) == (12, 2, 4)
        assert cfg.forced_length_replay.file == str(w["replay"])
        assert cfg.generation.dispatch.run_signals.enabled is (variant == "alg2+lpt+run_signals")
    mixed = [*trace, {"prompt": trace[0]["prompt"], "visit": 5, "lengths": [1, 2]}]
    with pytest.raises(SystemExit, match="differ in size"):
        frs.workload(mixed, priors, tmp_path / "w2")


def test_only_whole_visits_count():
    trace = _trace(prompts=6, visits=3, size=2)
    partial = [g for g in trace if g["visit"] < 2] + [g for g in trace if g["visit"] == 2][:4]  # drawn ahead
    assert ev.complete_visits(partial) == [g for g in partial if g["visit"] < 2]
    assert ev.complete_visits(trace) == trace
    gap = [g for g in trace if g["visit"] != 1]  # visit 2 whole but 1 missing: 2 is not the next visit
    assert ev.complete_visits(gap) == [g for g in trace if g["visit"] == 0]
