"""The registry of reward kinds: name -> factory building the ``RewardFunction`` from a run config.

Factories import their kind's module when called, so a kind's dependencies load only where it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from services.common.registry import Registry
from services.reward.protocol import RewardFunction

if TYPE_CHECKING:
    from services.common.config import RunConfig

REWARD_KINDS: Registry[Callable[[RunConfig], RewardFunction]] = Registry("reward kind")


@REWARD_KINDS.register("rule")
def _rule(cfg: RunConfig) -> RewardFunction:
    from services.reward.rule import RuleReward

    return RuleReward(cfg.agentic)
