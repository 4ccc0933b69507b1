"""Evaluation suites and the forgetting check through a whole run (real processes: SGS, reward worker, trainer).

The run trains on count-down rows with a reward that prefers short answers (``userfns/lengths.py``:
``brevity``) and carries two suites of 100 greedy answers to other count-down rows: ``long``
(correct when an answer has at least 8 characters, as 97% of the warm start's do) is built to be
forgotten, ``short`` (the opposite) can only rise. Both are scored at the warm start, after every
second step and at the end. The first run keeps going after the flag (a warning); the second sets
``eval.stop_on_forgetting`` and ends after the step whose evaluation flagged. ``braid eval`` of the
first run's ``final/`` scores every suite again, sample for sample as the run did.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.report import write_report
from services.run.suites import read_answers
from tests.integration.datasets import USERFNS, write_rows
from tests.integration.runs import run_smoke

ITERATIONS = 4


def overrides(rows: Path, cache: Path, *extra: str) -> list[str]:
    fields = {"data": str(rows), "prompt_field": "q", "answer_field": "a", "prompts": 100, "temperature": 0,
              "every": 2}
    suites = [{"name": "long", **fields, "terms": [{"fn": "lengths:long_answer"}]},
              {"name": "short", **fields, "terms": [{"fn": "lengths:short_answer"}]}]
    return [f"cache_dir={cache}", "weights.transport=direct", "task.kind=dataset", f"task.dataset.train={rows}",
            "task.dataset.prompt_field=q", "task.dataset.answer_field=a", "task.dataset.name=countdown-file",
            f"reward.python_path=[{USERFNS}]", "reward.terms=[{fn: 'lengths:brevity'}]", "eval.prompts=16",
            f"trainer.iterations={ITERATIONS}", "trainer.lr=0.002",  # a strong push: the flag comes at step 2
            "trainer.checkpoint_every=0", "eval.suites=" + json.dumps(suites), *extra]


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("suites") / "countdown.jsonl"
    write_rows(path, 200)
    return path


@pytest.fixture(scope="module")
def warned(tmp_path_factory, rows, smoke_cache) -> tuple[Path, dict, list[dict]]:
    """(run dir, summary, metrics rows) of the run the flag only warns."""
    run_dir = tmp_path_factory.mktemp("warned")
    summary, metrics = run_smoke(run_dir, _warm(smoke_cache), overrides(rows, smoke_cache))
    return run_dir, summary, metrics


def _warm(cache: Path) -> Path:
    from services.common.config import load_config
    from services.policy.warmstart import ensure_warmstart
    from tests.conftest import FAST_ENGINE, ROOT

    return ensure_warmstart(load_config(ROOT / "deploy/configs/smoke.yaml", [FAST_ENGINE, f"cache_dir={cache}"]),
                            progress=False)


def test_the_forgotten_suite_is_flagged_in_the_summary_and_the_report_and_the_run_goes_on(warned):
    run_dir, summary, metrics = warned
    assert summary["iterations"] == ITERATIONS and summary["stopped_early"] is None
    assert list(summary["suites"]) == ["heldout", "long", "short"]
    long, short = summary["suites"]["long"], summary["suites"]["short"]
    assert long["before"]["accuracy"] > 0.8 and long["prompts"] == 100 and long["temperature"] == 0.0
    (flag,) = summary["forgetting"]  # only the suite built to be forgotten, never the one that rises
    assert (flag["suite"], flag["weight_version"], flag["before"]) == ("long", ITERATIONS, long["before"]["accuracy"])
    assert flag["now"] == long["after"]["accuracy"] and flag["drop_in_stderr"] > 3.0
    assert flag["stderr"] == pytest.approx((long["before"]["stderr"] ** 2 + long["after"]["stderr"] ** 2) ** 0.5)
    assert short["after"]["accuracy"] > short["before"]["accuracy"] and summary["suites_forgotten"] == 1

    # scored between steps at version 2 (iteration 1's row), the held-out split only at the ends
    scored = [(r["iteration"], sorted(r["suite_accuracy"])) for r in metrics if "suite_accuracy" in r]
    assert scored == [(1, ["long", "short"])] and metrics[1]["weight_version"] == 2
    assert summary["forgetting_between_steps"] == metrics[1]["forgetting"]
    assert metrics[1]["suite_eval_s"] > 0 and summary["suite_eval_seconds"] == metrics[1]["suite_eval_s"]
    assert metrics[2]["t_start"] >= metrics[1]["t_end"] + metrics[1]["suite_eval_s"]  # outside the iterations

    # every evaluation's answers, prompt by prompt: the summary's accuracies are theirs
    answers = read_answers(run_dir / "evals" / f"long-v{ITERATIONS:05d}.jsonl")
    assert len(answers) == 100 and sum(answers.values()) / 100 == long["after"]["accuracy"]
    assert (run_dir / "evals" / "heldout-v00000.jsonl").is_file()

    report = write_report(run_dir).read_text()
    assert report.index("FORGETTING: suite long") < report.index("| metric | value |")  # at the top
    assert "| long | 100 | greedy | 2 |" in report and "**flagged** |" in report
    assert (run_dir / "suites.png").is_file() and "![evaluation suites](suites.png)" in report
    meta = json.loads((run_dir / "final" / "final.json").read_text())
    assert meta["suites"]["long"]["accuracy"] == long["after"]["accuracy"]


def test_braid_eval_scores_every_suite_of_the_config_as_the_run_did(warned, tmp_path, capsys):
    from flows.cli import main

    run_dir, summary, _ = warned
    capsys.readouterr()
    code = main(["eval", "--model", str(run_dir / "final"), "--config", str(run_dir / "config.json"),
                 "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    got = json.loads(captured.out)["suites"]
    assert list(got) == ["heldout", "long", "short"]
    for name, suite in got.items():  # seeded: the same answers as the run's final evaluation
        after = summary["suites"][name]["after"]
        assert (suite["accuracy"], suite["stderr"], suite["prompts"]) == (after["accuracy"], after["stderr"],
                                                                         after["prompts"])
        assert suite["run"]["accuracy"] == after["accuracy"]
        assert f"braid eval: {name}: {after['accuracy']:.3f} ± {after['stderr']:.3f}" in captured.err


def test_stop_on_forgetting_ends_the_run_after_the_flagged_step(tmp_path, rows, smoke_cache):
    summary, metrics = run_smoke(tmp_path, _warm(smoke_cache), overrides(rows, smoke_cache,
                                                                         "eval.stop_on_forgetting=true"))
    assert summary["stopped_early"] == {"weight_version": 2, "reason": "eval.stop_on_forgetting", "suites": ["long"]}
    assert [r["iteration"] for r in metrics] == [0, 1] and summary["iterations"] == summary["final_weight_version"] == 2
    # the final evaluation is that step's policy: the flagged scores, not scored twice
    assert summary["suites"]["long"]["after"]["accuracy"] == metrics[1]["suite_accuracy"]["long"]
    assert [f["suite"] for f in summary["forgetting"]] == ["long"]
    assert json.loads((tmp_path / "final" / "final.json").read_text())["iteration"] == 2
