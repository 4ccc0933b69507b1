"""A small dataset of files for the integration tests: count-down prompts (the tiny model's alphabet)
under custom field names, and the overrides that make a run train on it with a user reward function."""

from __future__ import annotations

import json

from services.tasks.arith import ProblemSampler
from tests.conftest import ROOT

USERFNS = ROOT / "tests" / "integration" / "userfns"


def write_rows(path, n: int = 40) -> None:
    """Count-down prompts (the tiny model's alphabet) under custom field names; every 4th row is marked boom."""
    problems = ProblemSampler(7, max_steps=3).batch(n)
    path.write_text("".join(json.dumps({"q": p.prompt, "a": p.answer, "boom": i % 4 == 0}) + "\n"
                            for i, p in enumerate(problems)))


def dataset_overrides(path) -> list[str]:
    return ["task.kind=dataset", f"task.dataset.train={path}", "task.dataset.prompt_field=q",
            "task.dataset.answer_field=a",
            "task.dataset.name=countdown-file", f"reward.python_path=[{USERFNS}]",
            "reward.terms=[{fn: 'length_reward:length_and_suffix'}]", "eval.prompts=8"]
