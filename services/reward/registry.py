"""The registry of reward kinds: name -> factory building the ``RewardFunction`` from a run config.

Factories import their kind's module when called, so the rule kind never imports torch; the
model kind checks its directory before importing it (a worker without a model fails fast).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from services.common.registry import Registry
from services.reward.protocol import RewardFunction, RewardUnavailable

if TYPE_CHECKING:
    from services.common.config import RunConfig

REWARD_KINDS: Registry[Callable[[RunConfig], RewardFunction]] = Registry("reward kind")
MODEL_META = "reward_meta.json"  # written by `braid reward train` beside the checkpoint


@REWARD_KINDS.register("rule")
def _rule(cfg: RunConfig) -> RewardFunction:
    from services.reward.rule import RuleReward

    if cfg.task.kind != "dataset" and not cfg.eval.suites:
        return RuleReward(cfg.agentic)
    from services.reward.dataset import DatasetReward

    datasets = []
    if cfg.task.dataset is not None:  # the run's own rows: reward.terms (services.reward.dataset)
        datasets.append(DatasetReward(cfg.reward, (cfg.task.dataset.name,)))
    for suite in cfg.eval.suites:  # each evaluation suite: its own terms, under its name
        datasets.append(DatasetReward(cfg.reward.model_copy(update={"terms": suite.terms}), (suite.name,)))
    return RuleReward(cfg.agentic, *datasets)


@REWARD_KINDS.register("emulated")
def _emulated(cfg: RunConfig) -> RewardFunction:
    from services.reward.emulated import EmulatedReward

    extra = (cfg.task.dataset.name,) if cfg.task.kind == "dataset" and cfg.task.dataset is not None else ()
    return EmulatedReward(cfg.reward.rate, extra)


@REWARD_KINDS.register("model")
def _model(cfg: RunConfig) -> RewardFunction:
    path = check_model_dir(cfg.reward.model_path)
    from services.reward.model import ClassifierReward

    return ClassifierReward.load(path)


def check_model_dir(path: str | None) -> Path:
    """``path`` as a directory `braid reward train` wrote; ``RewardUnavailable`` naming what is missing."""
    if not path:
        raise RewardUnavailable(
            "reward.kind 'model' needs reward.model_path (a directory written by `braid reward train`)"
        )
    missing = [name for name in ("config.json", "tokenizer.json", MODEL_META) if not (Path(path) / name).is_file()]
    if missing:
        raise RewardUnavailable(f"reward.model_path {path!r} is not a reward model written by `braid reward train` "
                                f"(missing {', '.join(missing)})")
    return Path(path)
