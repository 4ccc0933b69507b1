"""Registry checks a run passes before anything starts.

The config schema (``services.common.config``) stays pure data: which keys the registries hold
(engines, dispatch policies) is checked here, when a run is prepared (``braid run``, ``braid
config``, the flow's ``prepare-run``), so a typo fails at once and names what is registered.
"""

from __future__ import annotations

from services.common.config import ConfigError, RunConfig


def check_registries(cfg: RunConfig) -> RunConfig:
    """Return ``cfg`` if every registry key it names exists; raise ``ConfigError`` naming the field otherwise."""
    from services.generation.engine import ENGINES
    from services.generation.scheduling.dispatch import policy_names

    if cfg.generation.engine not in ENGINES:
        raise ConfigError(f"generation.engine {cfg.generation.engine!r} is not one of {sorted(ENGINES)}")
    if cfg.generation.dispatch.policy not in policy_names():
        raise ConfigError(f"generation.dispatch.policy {cfg.generation.dispatch.policy!r} is not one of {policy_names()}")
    return cfg
