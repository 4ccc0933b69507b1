"""Custom ``prefect.yaml`` build steps (run by ``prefect deploy``, importable by dotted path).

``run_config`` resolves a run config file into the ``rl_training`` deployment's default
``config`` parameter, so the UI's Run form starts from the same values as ``make run``
(``deploy/configs/default.yaml``) without copying them into ``prefect.yaml``; an invalid file
fails ``prefect deploy`` naming the file and the field.
"""

from __future__ import annotations


def run_config(path: str, overrides: list[str] | None = None) -> dict:
    """Step output ``{"config": <the resolved run config as JSON>}``."""
    from flows.registries import check_registries
    from services.common.config import load_config

    return {"config": check_registries(load_config(path, list(overrides or []))).model_dump(mode="json")}
