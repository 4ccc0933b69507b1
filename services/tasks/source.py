"""The task of a run, whatever its kind: the prompts the trainer draws, the held-out set, the reward request.

``task.kind`` picks the source:

- ``arith`` — the built-in count-down family (``services.tasks.arith``): problems drawn from a
  seeded power law, 500 held-out problems fixed by ``eval.seed`` and excluded from training;
- ``dataset`` — the user's own rows (``services.tasks.dataset``): JSONL, JSON or Parquet files,
  field mapping, template, system prompt, a held-out set drawn by ``eval.seed``, epochs.

Both give the same ``TaskSource``: ``sampler`` (``batch(n)``, and ``state()``/``restore()``: the
data cursor a recovery checkpoint keeps, so a restarted run draws each prompt exactly once),
``eval_set`` and ``fingerprint``. Their items share the attributes the pipeline reads:
``prompt_id``, ``prompt`` (the user message), ``system`` (a system message or None), ``task``
(the tag: routing affinity, reward requests), ``group`` or else ``difficulty`` (the evaluation
breakdown's key),
``reference`` and ``row_json`` (what a dataset's reward terms judge against).
``reward_request`` turns an item and a completion into the reward service's request: rewards of
every task are computed by the reward workers (``services.reward``), never in the trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from services.common.config import EvalConfig, TaskConfig
    from services.reward.protocol import RewardRequest


class TaskItem(Protocol):
    prompt_id: str
    prompt: str
    system: str | None
    task: str
    difficulty: int
    group: str
    reference: str
    row_json: str


class Sampler(Protocol):
    def batch(self, n: int) -> list[Any]: ...
    def state(self) -> tuple: ...
    def restore(self, state: tuple) -> None: ...


@dataclass
class TaskSource:
    name: str  # the task tag of every item
    sampler: Sampler
    eval_set: list[Any]
    fingerprint: Callable[[list[Any]], str]


def build_task(task: TaskConfig, evaluation: EvalConfig) -> TaskSource:
    """The training stream (seeded by ``task.seed``) and the held-out set (``eval.prompts`` items
    fixed by ``eval.seed``, never drawn for training) of ``task.kind``."""
    if task.kind == "dataset":
        from services.tasks import dataset

        assert task.dataset is not None  # TaskConfig's validator
        train, held_out = dataset.load_dataset(task.dataset, evaluation.prompts, evaluation.seed)
        sampler = dataset.DatasetSampler(train, task.seed, shuffle=task.dataset.shuffle, epochs=task.dataset.epochs)
        return TaskSource(task.dataset.name, sampler, held_out, dataset.fingerprint)
    from services.tasks import arith

    dist = task.distribution()
    eval_set = arith.eval_problems(evaluation.seed, evaluation.prompts, **dist)
    held_out = frozenset(p.prompt for p in eval_set)
    sampler = arith.ProblemSampler(task.seed, exclude=held_out, **dist)  # type: ignore[arg-type]
    return TaskSource("arith", sampler, eval_set, arith.fingerprint)


def reward_request(item: TaskItem, completion: str, request_id: str) -> RewardRequest:
    """The reward service's request for one single-turn completion of ``item``."""
    from services.reward.protocol import RewardRequest

    return RewardRequest(request_id, item.task, 0, item.prompt, (completion,), (), item.reference, item.row_json)
