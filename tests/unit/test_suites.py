"""Evaluation suites and the forgetting check: the judgement and the schedule (pure), the ``eval``
config's refusals, a suite's rows through the training data's loader, the checks before a run, and
each suite's own reward terms in the rule reward."""

from __future__ import annotations

import json
import math

import pytest

from flows.registries import check_run
from services.common.config import ConfigError, load_config
from services.reward.protocol import RewardRequest
from services.reward.registry import REWARD_KINDS
from services.run.forgetting import Score, due, judge, judge_all
from services.run.suites import GREEDY, build_suites, wire_temperature
from services.tasks.dataset import DatasetError, load_suite
from tests.conftest import ROOT

SMOKE = ROOT / "deploy/configs/smoke.yaml"


def _rows(path, n=30):
    path.write_text("".join(json.dumps({"q": f"What is {i} times 3?", "a": 3 * i, "kind": "mul"}) + "\n"
                            for i in range(n)))
    return path


def _suite(path, **over) -> str:
    fields = {"name": "times", "data": str(path), "prompt_field": "q", "answer_field": "a", **over}
    return "eval.suites=[" + json.dumps(fields) + "]"


# ---------------------------------------------------------------- the judgement (pure)
def test_a_drop_beyond_the_threshold_is_flagged_with_its_standard_error():
    before, now = Score(0.72, 0.045, 100), Score(0.35, 0.048, 100)
    flag = judge("word-mul", before, now, 3.0, 20)
    se = math.sqrt(0.045 ** 2 + 0.048 ** 2)
    assert flag is not None and (flag.suite, flag.before, flag.now, flag.weight_version) == ("word-mul", 0.72, 0.35, 20)
    assert flag.stderr == pytest.approx(se) and flag.drop_in_stderr == pytest.approx(0.37 / se)
    assert judge("word-mul", before, now, 0.37 / se + 0.01, 20) is None  # within the declared number of s.e.


def test_gains_ties_and_small_drops_are_not_flagged_and_a_certain_drop_is():
    assert judge("s", Score(0.3, 0.05, 100), Score(0.6, 0.05, 100), 3.0, 1) is None
    assert judge("s", Score(0.3, 0.05, 100), Score(0.3, 0.05, 100), 0.1, 1) is None
    assert judge("s", Score(0.5, 0.05, 100), Score(0.45, 0.05, 100), 3.0, 1) is None
    certain = judge("s", Score(1.0, 0.0, 10), Score(0.0, 0.0, 10), 3.0, 1)  # both s.e. 0: any drop is beyond
    assert certain is not None and certain.drop_in_stderr == math.inf
    with pytest.raises(ValueError, match="threshold_se"):
        judge("s", Score(0.5, 0.05, 100), Score(0.4, 0.05, 100), 0.0, 1)


def test_judge_all_keeps_the_suites_order_and_needs_every_warm_start():
    before = {"heldout": Score(0.2, 0.02, 500), "a": Score(0.9, 0.03, 100), "b": Score(0.8, 0.04, 100)}
    now = {"heldout": Score(0.5, 0.02, 500), "b": Score(0.1, 0.03, 100), "a": Score(0.2, 0.04, 100)}
    assert [f.suite for f in judge_all(before, now, 3.0, 4)] == ["b", "a"]
    with pytest.raises(ValueError, match="no warm-start"):
        judge_all({"a": before["a"]}, now, 3.0, 4)


def test_a_suite_is_due_every_n_steps_before_the_last():
    assert [v for v in range(11) if due(3, v, 10)] == [3, 6, 9]
    assert [v for v in range(11) if due(5, v, 10)] == [5]  # 10 is the final evaluation's
    assert not any(due(0, v, 10) for v in range(11))
    with pytest.raises(ValueError):
        due(-1, 2, 10)


# ---------------------------------------------------------------- the config
@pytest.mark.parametrize("overrides, message", [
    (['eval.suites=[{name: a, data: x.jsonl}, {name: a, data: y.jsonl}]'], "suite names a occur more than once"),
    (['eval.suites=[{name: heldout, data: x.jsonl}]'], "run's own held-out split"),
    (['eval.suites=[{name: "a b", data: x.jsonl}]'], "eval.suites.0.name"),
    (['eval.suites=[{name: a, data: x.jsonl, template: "Q:"}]'], "must contain '{prompt}'"),
    (['eval.suites=[{name: a, data: x.jsonl, max_new_tokens: 65}]'], "exceeds generation.max_new_tokens (64)"),
    (['eval.suites=[{name: a, data: x.jsonl, temperature: 3}]'], "eval.suites.0.temperature"),
    (['eval.suites=[{name: a, data: x.jsonl}]', "reward.kind=model", "reward.model_path=/m"], "reward.kind must be"),
    (["eval.every=2", "agentic.enabled=true"], "an agentic run scores its held-out episodes"),
    (["eval.forgetting_se=0"], "eval.forgetting_se"),
])
def test_bad_suites_are_refused_naming_the_field(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(SMOKE, overrides)
    assert message in str(err.value)


def test_a_suite_named_like_the_training_dataset_is_refused(tmp_path):
    rows = _rows(tmp_path / "d.jsonl")
    with pytest.raises(ConfigError, match="the training dataset's"):
        load_config(SMOKE, ["task.kind=dataset", f"task.dataset.train={rows}", "task.dataset.prompt_field=q",
                            "task.dataset.answer_field=a", "task.dataset.name=times", _suite(rows)])


# ---------------------------------------------------------------- rows and checks
def test_a_suite_reads_every_row_or_a_seeded_draw_with_ids_of_its_own(tmp_path):
    cfg = load_config(SMOKE, [_suite(_rows(tmp_path / "d.jsonl"), group_field="kind")]).eval.suites[0]
    every = load_suite(cfg.data, cfg, None, 1)
    assert [i.prompt_id for i in every] == [f"times:{i}" for i in range(30)] and every[2].answer == "6"
    assert every[0].task == "times" and every[0].group == "mul"
    ten, five = load_suite(cfg.data, cfg, 10, 7), load_suite(cfg.data, cfg, 5, 7)
    assert [i.prompt for i in ten[:5]] == [i.prompt for i in five] and ten != load_suite(cfg.data, cfg, 10, 8)
    with pytest.raises(DatasetError, match="fewer than the suite's prompts"):
        load_suite(cfg.data, cfg, 31, 7)


def test_the_checks_before_a_run_read_the_suite_and_make_its_path_absolute(tmp_path, monkeypatch):
    _rows(tmp_path / "d.jsonl")
    monkeypatch.chdir(tmp_path)
    cfg = check_run(load_config(SMOKE, [_suite("d.jsonl")]))
    assert cfg.eval.suites[0].data == str(tmp_path / "d.jsonl")
    lines = (tmp_path / "d.jsonl").read_text().splitlines()
    (tmp_path / "d.jsonl").write_text("\n".join([*lines[:3], json.dumps({"q": 3, "a": 1}), *lines[3:]]) + "\n")
    with pytest.raises(ConfigError, match=r"eval.suites.0 \(times\): .*/d.jsonl:4: prompt field 'q'"):
        check_run(load_config(SMOKE, [_suite("d.jsonl")]))
    with pytest.raises(ConfigError, match="built-in task"):
        check_run(load_config(SMOKE, [_suite("d.jsonl", name="arith")]))
    _rows(tmp_path / "d.jsonl")
    with pytest.raises(ConfigError, match=r"eval.suites.0 \(times\).terms.0: .*no_such_module"):
        check_run(load_config(SMOKE, [_suite(tmp_path / "d.jsonl", terms=[{"fn": "no_such_module:f"}])]))


def test_build_suites_puts_the_held_out_split_first_with_each_suites_sampling(tmp_path):
    cfg = load_config(SMOKE, ["eval.every=3", "generation.temperature=0.7",
                              _suite(_rows(tmp_path / "d.jsonl"), temperature=0, prompts=8, every=2)])
    held, times = build_suites(cfg, ["h1", "h2"], "fp")
    assert (held.name, held.items, held.every, held.wire_temperature, held.temperature) == ("heldout", ["h1", "h2"],
                                                                                          3, 0.0, 0.7)
    assert (times.name, len(times.items), times.every, times.wire_temperature, times.temperature) == (
        "times", 8, 2, GREEDY, 0.0)
    assert times.describe()["prompts"] == 8 and len(times.fingerprint) == 16
    assert [wire_temperature(t) for t in (None, 0.0, 0.5)] == [0.0, GREEDY, 0.5]


def test_each_suite_is_scored_by_its_own_terms_beside_the_training_task(tmp_path):
    exact = _suite(_rows(tmp_path / "d.jsonl"), terms=[{"fn": "format", "pattern": "^yes"}])
    cfg = load_config(SMOKE, [exact])
    reward = REWARD_KINDS["rule"](cfg)

    def request(completion: str) -> RewardRequest:
        return RewardRequest("r", "times", 0, "What is 2 times 3?", (completion,), (), "6", "{}")

    assert reward.score(request("yes, 7")).info["correct"] == "true"  # format only: reward 1 is correct
    assert reward.score(request("6")).info["correct"] == "false"
    assert reward.score(RewardRequest("a", "arith", 0, "15-3>9=", ("15#12#9",), ())).reward == 1.0
    assert "times" in reward.extra_tasks and "arith" not in reward.extra_tasks
