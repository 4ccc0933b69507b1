"""CPU pinning of a service process: the one-machine emulation of disaggregated resources.

On one host, "generation and training on separate resources" means separate cores: each service
pins itself (``generation.cpus`` / ``trainer.cpus``) before torch starts its thread pools, so every
thread it creates inherits the set. An empty list leaves the process unpinned.
"""

from __future__ import annotations

import os


def pin_cpus(cpus: list[int], what: str) -> None:
    """Restrict this process to ``cpus``; raise ``ValueError`` naming the service and the CPUs
    this machine offers when one is not available."""
    if not cpus:
        return
    available = sorted(os.sched_getaffinity(0))
    missing = sorted(set(cpus) - set(available))
    if missing:
        raise ValueError(f"{what}: CPUs {missing} are not available to this process (available: {available})")
    os.sched_setaffinity(0, set(cpus))
