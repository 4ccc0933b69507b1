"""The registry of environment kinds: name -> ``Environment`` subclass (``from_config`` builds one)."""

from __future__ import annotations

from services.agentic.calculator import CalculatorEnv
from services.agentic.protocol import Environment
from services.agentic.walk import WalkEnv
from services.common.registry import Registry

ENVIRONMENTS: Registry[type[Environment]] = Registry("environment kind")
ENVIRONMENTS.register(CalculatorEnv.kind)(CalculatorEnv)
ENVIRONMENTS.register(WalkEnv.kind)(WalkEnv)
