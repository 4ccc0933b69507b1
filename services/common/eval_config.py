"""The ``eval`` section of the run config: the run's held-out split, the evaluation suites, the forgetting check.

A run evaluates its **suites** (``services.run.suites``): the held-out split of its own task first
(``eval.prompts`` items fixed by ``eval.seed``, named ``heldout``), then every ``eval.suites``
entry, a named set of rows from a data file read by the training data's loader and refusals
(``services.tasks.dataset``) with its own field mapping, template, reward terms, size, temperature
(greedy allowed) and schedule. Every suite is scored at the warm start and at the end, and
``every`` N iterations between (on the SGS, between optimizer steps: docs/evaluation.md). A suite
whose accuracy falls below its warm-start value by more than ``forgetting_se`` standard errors is
flagged (``services.run.forgetting``); ``stop_on_forgetting`` ends the run at such a flag.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, field_validator

from services.common.reward_config import RewardTermConfig
from services.common.strict import StrictModel
from services.common.task_config import NAME_PATTERN, RowsConfig

if TYPE_CHECKING:
    from services.common.config import RunConfig

HELDOUT = "heldout"  # the name of the run's own held-out split among its suites (always the first)
MAX_SUITES = 16


def _numeric() -> list[RewardTermConfig]:
    return [RewardTermConfig(fn="numeric")]


class SuiteConfig(RowsConfig):
    """One evaluation suite: a data file's rows, scored by the suite's own reward terms."""

    name: str = Field(
        ..., min_length=1, max_length=64, pattern=NAME_PATTERN,
        description=f"The suite's name: its task tag in reward requests and its key in metrics.jsonl, summary.json, "
        f"the report and the trackers; unique, not '{HELDOUT}' (the run's own held-out split) nor the training "
        "dataset's name.",
    )
    data: str = Field(
        ..., min_length=1,
        description="The suite's rows: a local .jsonl/.json/.parquet file (gzip too), read by the training data's "
        "loader with this suite's field mapping; a relative path is taken from the directory braid runs in.",
    )
    prompts: int | None = Field(
        None, ge=1, le=1_000_000,
        description="Rows scored, drawn by eval.seed (a smaller count scores a prefix of a larger one's draw); "
        "None = every row, in file order. One sample per row.",
    )
    temperature: float | None = Field(
        None, ge=0.0, le=2.0,
        description="Sampling temperature of the suite's answers: 0 = greedy; None = generation.temperature (what "
        "the run trains at). Seeded by eval.seed either way, so every evaluation is reproducible.",
    )
    max_new_tokens: int = Field(
        0, ge=0, le=1_000_000,
        description="Longest answer in tokens; 0 = generation.max_new_tokens (which also bounds this).",
    )
    every: int = Field(
        0, ge=0, le=1_000_000,
        description="Also score the suite after every this-many optimizer steps (on the SGS, between steps); "
        "0 = only at the warm start and at the end.",
    )
    terms: list[RewardTermConfig] = Field(
        default_factory=_numeric, min_length=1, max_length=16,
        description="The suite's reward terms (as reward.terms; their functions import from reward.python_path): a "
        "sample is correct when every judging term says so.",
    )


class EvalConfig(StrictModel):
    """Evaluation: the held-out split and the suites, at the warm start, every N iterations and at the end."""

    prompts: int = Field(500, ge=1, le=1_000_000, description="Held-out prompts.")
    seed: int = Field(12345, ge=0, description="Seed that fixes the held-out prompts, every suite's draw and samples.")
    every: int = Field(
        0, ge=0, le=1_000_000,
        description=f"Also score the held-out split (suite '{HELDOUT}') after every this-many optimizer steps; 0 = "
        "only at the warm start and at the end.",
    )
    suites: list[SuiteConfig] = Field(
        default_factory=list, max_length=MAX_SUITES,
        description="Evaluation suites besides the held-out split (docs/evaluation.md); single-turn runs with "
        "reward.kind 'rule' only.",
    )
    forgetting_se: float = Field(
        3.0, gt=0.0, le=100.0,
        description="Flag a suite whose accuracy falls below its warm-start value by more than this many standard "
        "errors of the difference (services/run/forgetting.py).",
    )
    stop_on_forgetting: bool = Field(
        False,
        description="End the run at the first evaluation that flags a suite (the final evaluation and final/ then "
        "hold the policy of that step); false = a warning only.",
    )

    @field_validator("suites")
    @classmethod
    def _names_unique(cls, suites: list[SuiteConfig]) -> list[SuiteConfig]:
        names = [s.name for s in suites]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"suite names {', '.join(twice)} occur more than once")
        if HELDOUT in names:
            raise ValueError(f"suite name '{HELDOUT}' is the run's own held-out split's; choose another")
        return suites


def check_suites_fit(run: RunConfig) -> None:
    """What suites and periodic evaluation need of the rest of the run (``RunConfig``'s validator): a
    single-turn run whose rule reward judges the suites' terms, answers within the service's limit,
    and names that do not collide with the training dataset's."""
    ev = run.eval
    if not ev.suites and not ev.every:
        return
    if run.agentic.enabled:
        raise ValueError("eval.suites and eval.every: an agentic run scores its held-out episodes at the warm start "
                         "and the end only (leave both unset)")
    if ev.suites and run.reward.kind != "rule":
        raise ValueError(f"eval.suites are scored by their own rule terms: reward.kind must be 'rule', not "
                         f"{run.reward.kind!r}")
    limit = run.generation.max_new_tokens
    for i, suite in enumerate(ev.suites):
        if suite.max_new_tokens > limit:
            raise ValueError(f"eval.suites.{i} ({suite.name}): max_new_tokens {suite.max_new_tokens} exceeds "
                             f"generation.max_new_tokens ({limit})")
        if run.task.dataset is not None and suite.name == run.task.dataset.name:
            raise ValueError(f"eval.suites.{i}: name {suite.name!r} is the training dataset's (task.dataset.name); "
                             "a suite's name is its own task tag: choose another")
