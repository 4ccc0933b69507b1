"""Agentic multi-turn rollouts (RollArt §4–5): environments, environment workers, EnvManagers.

Nothing heavy is imported here; see ``protocol`` (the environment interface), ``registry`` (the
kinds), ``server``/``client`` (the worker service), ``manager``/``runner`` (trajectories).
"""
