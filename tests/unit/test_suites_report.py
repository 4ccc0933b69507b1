"""Where a run's suites show up besides summary.json: the report (curve points, table, flags at the top),
the trackers' names, the flow's log lines and ``braid eval``'s per-suite JSON, from hand-made files."""

from __future__ import annotations

from types import SimpleNamespace

from flows.eval_cli import suites_report
from flows.report_suites import banner, plot_suites, shown, suite_lines, suite_points
from flows.rl_training import suites_line
from flows.tracking import row_metrics, summary_metrics
from services.common.config import load_config
from services.run.evaluate import EvalResult
from tests.conftest import ROOT


def _result(version: int, acc: float, se: float, n: int = 100) -> dict:
    return {"weight_version": version, "prompts": n, "accuracy": acc, "stderr": se, "response_len_mean": 9.0,
            "by_difficulty": {}, "reward_failures": 0}


FLAG = {"suite": "word-mul", "before": 0.72, "now": 0.35, "stderr": 0.066, "drop_in_stderr": 5.6, "weight_version": 4}
SUMMARY = {
    "suites": {"heldout": {"prompts": 500, "temperature": 0.6, "every": 0,
                           "before": _result(0, 0.2, 0.018, 500), "after": _result(4, 0.5, 0.022, 500)},
               "word-mul": {"prompts": 100, "temperature": 0.0, "every": 2,
                            "before": _result(0, 0.72, 0.045), "after": _result(4, 0.35, 0.048)}},
    "forgetting": [FLAG], "forgetting_between_steps": [{**FLAG, "now": 0.5, "weight_version": 2}],
    "forgetting_threshold_se": 3.0, "suite_eval_seconds": 12.5, "stopped_early": None, "suites_forgotten": 1,
}
ROWS = [{"iteration": 0, "weight_version": 1},
        {"iteration": 1, "weight_version": 2, "suite_eval_s": 12.5, "suite_accuracy": {"word-mul": 0.5},
         "suite_stderr": {"word-mul": 0.05}, "suites_forgotten": 1, "forgetting": SUMMARY["forgetting_between_steps"]}]


def test_each_suite_is_a_curve_from_the_warm_start_through_the_steps_to_the_end(tmp_path):
    points = suite_points(ROWS, SUMMARY)
    assert points == {"heldout": [(0, 0.2, 0.018), (4, 0.5, 0.022)],
                      "word-mul": [(0, 0.72, 0.045), (2, 0.5, 0.05), (4, 0.35, 0.048)]}
    assert plot_suites(ROWS, SUMMARY, tmp_path / "suites.png") and (tmp_path / "suites.png").stat().st_size > 0
    only_heldout = {**SUMMARY, "suites": {"heldout": SUMMARY["suites"]["heldout"]}}
    assert not shown(ROWS[:1], only_heldout) and not plot_suites(ROWS[:1], only_heldout, tmp_path / "none.png")
    assert not shown([], {"mode": "sync"})  # a summary from before suites existed


def test_the_report_names_each_flag_once_at_the_top_and_tables_every_suite():
    top = "\n".join(banner(SUMMARY))
    assert "suite word-mul fell from 0.720 to 0.350 at weight version 4" in top and "(final evaluation)" in top
    assert "to 0.500 at weight version 2" in top and "(between steps)" in top
    again = {**SUMMARY, "forgetting_between_steps": [FLAG], "stopped_early": {
        "weight_version": 4, "reason": "eval.stop_on_forgetting", "suites": ["word-mul"]}}
    assert "\n".join(banner(again)).count("fell from") == 1 and "stopped after the step to weight version 4" in \
        "\n".join(banner(again))
    assert banner({**SUMMARY, "forgetting": [], "forgetting_between_steps": []}) == []
    table = "\n".join(suite_lines(ROWS, SUMMARY))
    assert "| heldout | 500 | 0.6 | - | 0.200 ± 0.018 | 0.500 ± 0.022 | +0.300 (+10.6 s.e.) | - |" in table
    assert "| word-mul | 100 | greedy | 2 | 0.720 ± 0.045 | 0.350 ± 0.048 | -0.370 (-5.6 s.e.) | **flagged** |" in table


def test_trackers_get_each_suite_per_step_and_at_the_ends_and_the_flow_logs_a_line():
    assert row_metrics(ROWS[1]) == {"weight_version": 2.0, "suite_eval_s": 12.5, "suite_accuracy/word-mul": 0.5,
                                    "suite_stderr/word-mul": 0.05, "suites_forgotten": 1.0}
    metrics = summary_metrics(SUMMARY)
    assert metrics["summary/suite/word-mul/before"] == 0.72 and metrics["summary/suite/word-mul/after_stderr"] == 0.048
    assert metrics["summary/suites_forgotten"] == 1.0 and metrics["summary/suite/heldout/after"] == 0.5
    assert suites_line(ROWS[1]) == "suites at weight version 2: word-mul 0.500 ± 0.050 (12.5 s)"
    assert suites_line(ROWS[0]) is None


def test_braid_eval_reports_every_suite_beside_the_runs_own_score_of_the_same_prompts():
    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", ['eval.suites=[{name: a, data: x.jsonl, temperature: 0}]'])
    results = {"heldout": EvalResult(**_result(0, 0.25, 0.0765, 32)), "a": EvalResult(**_result(0, 0.5, 0.05))}
    meta = {"suites": {"heldout": {"accuracy": 0.25, "stderr": 0.0765, "prompts": 32, "fingerprint": "h"},
                       "a": {"accuracy": 0.4, "stderr": 0.05, "prompts": 100, "fingerprint": "other prompts"}}}
    got = suites_report(results, cfg, {"heldout": "h", "a": "fa"}, meta)
    assert list(got) == ["heldout", "a"] and got["a"]["temperature"] == 0.0 and got["heldout"]["temperature"] == 1.0
    assert (got["a"]["accuracy"], got["a"]["stderr"], got["a"]["prompts"]) == (0.5, 0.05, 100)
    assert got["heldout"]["run"]["accuracy"] == 0.25 and "run" not in got["a"]  # another prompt set: not compared
    assert "run" not in suites_report(results, SimpleNamespace(generation=cfg.generation, eval=cfg.eval),
                                      {"heldout": "h", "a": "fa"}, None)["heldout"]
