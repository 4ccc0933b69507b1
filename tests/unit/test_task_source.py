"""A run's task, whatever its kind: the task source, the reward request, and the checks before a run."""

from __future__ import annotations

import json

import pytest

from flows.registries import check_run
from services.common.config import ConfigError, EvalConfig, TaskConfig, load_config
from services.tasks import arith
from services.tasks.source import build_task, reward_request
from tests.conftest import ROOT

SMOKE = ROOT / "deploy/configs/smoke.yaml"


def _rows(path, n=30, **extra):
    path.write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": 2 * i, **extra}) + "\n"
                            for i in range(n)))
    return path


def _dataset(path, **over):
    return {"kind": "dataset", "dataset": {"train": str(path), "prompt_field": "question", **over}}


def test_the_arith_source_is_the_count_down_task_with_its_held_out_set():
    task = build_task(TaskConfig(), EvalConfig(prompts=20))
    assert task.name == "arith" and task.eval_set == arith.eval_problems(12345, 20, **TaskConfig().distribution())
    held = {p.prompt for p in task.eval_set}
    assert not held & {p.prompt for p in task.sampler.batch(500)}
    p = task.eval_set[0]
    assert reward_request(p, "1#2", "r").task == "arith" and reward_request(p, "1#2", "r").reference == ""


def test_the_dataset_source_draws_rows_and_carries_the_reference_and_row(tmp_path):
    task = build_task(TaskConfig.model_validate(_dataset(_rows(tmp_path / "d.jsonl"), name="sums")),
                      EvalConfig(prompts=5))
    assert task.name == "sums" and [i.prompt_id for i in task.eval_set] == [f"e{i}" for i in range(5)]
    drawn = task.sampler.batch(25)
    assert ({i.prompt for i in drawn}.isdisjoint({i.prompt for i in task.eval_set})
            and len({i.prompt for i in drawn}) == 25)
    item = drawn[0]
    request = reward_request(item, "It is 4.", "d0/1")
    assert (request.task, request.prompt, request.actions, request.reference) == ("sums", item.prompt,
                                                                                  ("It is 4.",), item.answer)
    assert json.loads(request.row_json)["question"] == item.prompt
    state = task.sampler.state()
    again = build_task(TaskConfig.model_validate(_dataset(tmp_path / "d.jsonl", name="sums")), EvalConfig(prompts=5))
    again.sampler.restore(state)
    assert [i.prompt for i in again.sampler.batch(10)] == [i.prompt for i in task.sampler.batch(10)]  # exactly once


def test_task_kind_and_dataset_go_together():
    with pytest.raises(ValueError, match=r"needs task.dataset"):
        TaskConfig(kind="dataset")
    with pytest.raises(ValueError, match=r"applies to task.kind 'dataset'"):
        TaskConfig.model_validate({"dataset": {"train": "x.jsonl"}})
    with pytest.raises(ValueError, match="must contain"):
        TaskConfig.model_validate({"kind": "dataset", "dataset": {"train": "x.jsonl", "template": "Q: {question}"}})


def test_an_agentic_run_refuses_a_dataset_task(tmp_path):
    with pytest.raises(ConfigError, match=r"task.kind 'dataset'"):
        load_config(SMOKE, ["agentic.enabled=true", "task.kind=dataset", f"task.dataset.train={tmp_path}/d.jsonl"])


def test_preparing_a_run_reads_the_data_and_makes_its_paths_absolute(tmp_path, monkeypatch):
    _rows(tmp_path / "d.jsonl")
    monkeypatch.chdir(tmp_path)
    cfg = check_run(load_config(SMOKE, ["task.kind=dataset", "task.dataset.train=d.jsonl",
                                        "task.dataset.prompt_field=question", "eval.prompts=5",
                                        "reward.python_path=[fns]"]))
    assert cfg.task.dataset.train == str(tmp_path / "d.jsonl") and cfg.reward.python_path == [str(tmp_path / "fns")]


@pytest.mark.parametrize("over, fragment", [
    (["task.dataset.prompt_field=nope"], ":1: prompt field 'nope' is missing"),
    (["task.dataset.epochs=1", "trainer.iterations=20"], "epochs"),
    (["task.dataset.name=calculator"], "built-in task"),
    (["task.dataset.train=/no/such.jsonl"], "/no/such.jsonl"),
    (["reward.terms=[{fn: 'no_such_module_here:f'}]"], "cannot import module 'no_such_module_here'"),
])
def test_preparing_a_run_refuses_bad_data_naming_it(tmp_path, over, fragment):
    base = ["task.kind=dataset", f"task.dataset.train={_rows(tmp_path / 'd.jsonl')}",
            "task.dataset.prompt_field=question", "eval.prompts=5"]
    with pytest.raises(ConfigError, match=r"task.dataset|reward.terms") as err:
        check_run(load_config(SMOKE, [*base, *over]))
    assert fragment in str(err.value)
