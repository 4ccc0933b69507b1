"""A run's evaluation suites: what each one is (``Suite``), and the answers file each evaluation leaves.

The held-out split of the run's own task is the first suite (``HELDOUT``: ``eval.prompts`` items
fixed by ``eval.seed``, sampled at the service's ``generation.temperature``); each ``eval.suites``
entry follows, its rows read by the training data's loader (``services.tasks.dataset.load_suite``)
and scored by its own reward terms in the reward service (its name is its task tag there). A
suite's answers are sampled at its own temperature (greedy below ``GREEDY``) and seeded with
``eval.seed`` like the held-out split's (``services.run.heldout``), so scoring the same weights
again gives the same answers. ``HeldOut.evaluate_suite`` scores one; ``services.run.evaluations``
decides when.

Every evaluation of a run (and of ``braid eval``) writes its answers, one JSON line per prompt
(``prompt_id``, ``correct``, ``reward``, ``length``, ``finish_reason``, ``completion``), to
``evals/<suite>-v<version>.jsonl``: evaluations of the same suite pair up prompt by prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from services.common.config import RunConfig
from services.common.eval_config import HELDOUT
from services.common.types import SampleRecord
from services.rollout.rewards import Outcome

# what a suite with temperature 0 sends: any value below the engines' GREEDY_BELOW (1e-5,
# services.generation.engine) samples greedily; 0 itself would mean the service's default
GREEDY = 1e-6
ANSWERS_DIR = "evals"
MAX_SHOWN_CHARS = 2000  # of a completion kept in the answers file


@dataclass(frozen=True)
class Suite:
    """One evaluation suite as the trainer scores it."""

    name: str
    items: list  # TaskItems, ids unique across suites
    every: int  # also scored after every this-many steps (0: warm start and end only)
    wire_temperature: float  # GenerateParams.temperature: 0 = the service's generation.temperature
    temperature: float  # what the answers are sampled at (0 = greedy), for reports
    max_new_tokens: int  # 0 = the service's generation.max_new_tokens
    fingerprint: str  # identifies the prompts (accuracies compare only on the same set)

    def describe(self) -> dict:
        """The suite's settings as the summary and ``braid eval`` record them."""
        return {"prompts": len(self.items), "temperature": self.temperature, "every": self.every,
                "max_new_tokens": self.max_new_tokens, "fingerprint": self.fingerprint}


def wire_temperature(temperature: float | None) -> float:
    """A suite's ``temperature`` as a request carries it: None -> 0 (the service's), 0 -> ``GREEDY``."""
    if temperature is None:
        return 0.0
    return GREEDY if temperature == 0 else temperature


def build_suites(cfg: RunConfig, heldout_items: list, heldout_fingerprint: str) -> list[Suite]:
    """The held-out split, then every ``eval.suites`` entry, loaded (``services.tasks.dataset.load_suite``)."""
    from services.tasks.dataset import fingerprint, load_suite

    gen = cfg.generation
    suites = [Suite(HELDOUT, heldout_items, cfg.eval.every, 0.0, gen.temperature, 0, heldout_fingerprint)]
    for s in cfg.eval.suites:
        items = load_suite(s.data, s, s.prompts, cfg.eval.seed)
        shown = gen.temperature if s.temperature is None else s.temperature
        suites.append(Suite(s.name, items, s.every, wire_temperature(s.temperature), shown, s.max_new_tokens,
                            fingerprint(items)))
    return suites


def answers_path(directory: Path, suite: str, version: int) -> Path:
    return directory / f"{suite}-v{version:05d}.jsonl"


def write_answers(path: Path, samples: list[SampleRecord], outcomes: list[Outcome], texts: list[str]) -> None:
    """One JSON line per answer, in prompt-id order (see the module docstring)."""
    rows = sorted(zip(samples, outcomes, texts, strict=True), key=lambda r: r[0].prompt_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps({"prompt_id": s.prompt_id, "correct": o.correct, "reward": o.reward,
                                       "length": len(s.token_ids), "finish_reason": s.finish_reason,
                                       "completion": t[:MAX_SHOWN_CHARS]}) + "\n" for s, o, t in rows))
    tmp.replace(path)


def read_answers(path: Path) -> dict[str, bool]:
    """An answers file as prompt id -> correct."""
    return {r["prompt_id"]: r["correct"] for r in map(json.loads, path.read_text().splitlines()) if r}
