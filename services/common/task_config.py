"""The task sections of the run config: the count-down distribution (``services.tasks.arith``),
shared by the single-turn task (``task``) and the agentic calculator environment
(``agentic.calculator``), and the user's own dataset (``task.dataset``, ``services.tasks.dataset``)."""

from __future__ import annotations

from pydantic import Field, model_validator

from services.common.strict import StrictModel

# A dataset prompt and its reference answer travel inside a reward request (services.reward.protocol):
# the same limit as any text of a transcript there.
MAX_DATASET_TEXT_CHARS = 4096
MAX_ROW_JSON_CHARS = 65536  # the whole row, as JSON, travels with each reward request (user functions read it)
NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"  # a task tag (services.common.pool_config.task_problem) without ':'


class CountdownDistribution(StrictModel):
    """How count-down problems are drawn: steps from a truncated power law, step size, start value."""

    min_steps: int = Field(1, ge=1, le=200, description="Fewest subtractions (scratchpad steps) a problem needs.")
    max_steps: int = Field(40, ge=1, le=200, description="Most subtractions (scratchpad steps) a problem needs.")
    alpha: float = Field(1.4, gt=0.0, le=10.0, description="Power-law tail: P(steps=q) ∝ q^-alpha.")
    max_step: int = Field(9, ge=2, le=9, description="The subtracted value d is drawn from 2..max_step.")
    max_value: int = Field(999, ge=102, le=10**9, description="Largest start value n.")

    @model_validator(mode="after")
    def _consistent(self) -> CountdownDistribution:
        if self.min_steps > self.max_steps:
            raise ValueError(f"min_steps ({self.min_steps}) must be <= max_steps ({self.max_steps})")
        if self.max_value < self.max_steps * self.max_step + 100:
            raise ValueError(
                f"max_value ({self.max_value}) must be >= max_steps * max_step + 100 "
                f"({self.max_steps * self.max_step + 100})"
            )
        return self

    def distribution(self) -> dict[str, int | float]:
        """The keyword arguments of ``arith``'s samplers."""
        return {
            "min_steps": self.min_steps,
            "max_steps": self.max_steps,
            "alpha": self.alpha,
            "max_step": self.max_step,
            "max_value": self.max_value,
        }


class RowsConfig(StrictModel):
    """How a file's rows become prompts and reference answers (``services.tasks.dataset.read_rows``): the
    fields a training dataset (``task.dataset``) and an evaluation suite (``eval.suites``) share."""

    prompt_field: str = Field(
        "prompt", min_length=1, max_length=256, description="Field of a row holding the prompt text."
    )
    answer_field: str = Field(
        "answer", min_length=1, max_length=256,
        description="Field of a row holding the reference answer (text or a number; the reward terms compare "
        "against it).",
    )
    system_prompt: str | None = Field(
        None, max_length=MAX_DATASET_TEXT_CHARS,
        description="System message before each prompt (model.chat_template: the template's system turn; without a "
        "template: prepended to the prompt text with a blank line). None = the template's own default, if any.",
    )
    template: str = Field(
        "{prompt}", min_length=1, max_length=MAX_DATASET_TEXT_CHARS,
        description="The user message: '{prompt}' is replaced by the prompt field's text (nothing else is "
        "interpreted, so braces in the data are safe).",
    )
    group_field: str | None = Field(
        None, min_length=1, max_length=256,
        description="Field whose value groups the held-out accuracy in the report (e.g. a category); rows without "
        "it form no group. None = no breakdown.",
    )
    name: str = Field(
        "dataset", min_length=1, max_length=64, pattern=NAME_PATTERN,
        description="The task's tag: in prompt ids' routing (generation.affinity), reward requests and the report.",
    )

    @model_validator(mode="after")
    def _template_has_prompt(self) -> RowsConfig:
        if "{prompt}" not in self.template:
            raise ValueError(f"template {self.template[:80]!r} must contain '{{prompt}}' (where the prompt text goes)")
        return self


class DatasetConfig(RowsConfig):
    """The user's own prompts and reference answers, read from local files (``services.tasks.dataset``)."""

    train: str = Field(
        ..., min_length=1,
        description="Training rows: a local .jsonl file (one JSON object per line) or .parquet file; a relative "
        "path is taken from the directory braid runs in.",
    )
    heldout: str | None = Field(
        None,
        description="Held-out evaluation rows (same format); eval.prompts of them are drawn by eval.seed. None = "
        "eval.prompts rows of train drawn by eval.seed and excluded from training.",
    )
    shuffle: bool = Field(True, description="Shuffle the training rows by task.seed, again at every epoch.")
    epochs: int | None = Field(
        None, ge=1, le=1_000_000,
        description="Passes over the training rows. None = as many as trainer.iterations needs; set, a run that "
        "needs more prompts than epochs x rows is refused before it starts.",
    )
