"""Dynamic repack of long-tail trajectories (Laminar §5, Algorithm 1), as pure policy.

Snapshots in, commands out; the clock is injected. The bounded runner
(``services.rollout.orchestrator``) takes a snapshot of every SGS instance (its Health: KV-cache
use, running and queued samples, installed weight version), asks ``RepackCoordinator.plan``,
and carries out each ``Migrate`` as StaleFlow's commands: Interrupt on the source (its
trajectories come back with their tokens so far), Route of each to the destination (re-prefill,
resume), and the freed source then takes the newest weights (Pull) when the lazy sync policy
(``routing.instances_to_sync``) says so. The simulator drives the same object.

- **Ramp-down** (Laminar §5.2): an instance whose KV use fell since the previous snapshot and
  is below ``c_max``, with nothing queued and fewer than ``batch_bound`` samples running: its
  remaining trajectories are the long tail, and the instance is under-used from here on.
- **Best-fit consolidation** (Algorithm 1): within each weight-version group, candidates
  sorted by KV use (smallest first, the easiest to release); each goes to the candidate that
  is fullest after the move among those it fits (KV ``<= c_max``, samples ``<= batch_bound``).
  A destination is never released in the same plan, a released source never receives, and a
  draining instance (a staged version pauses its admission) never receives.
  Same version only, so a migrated trajectory resumes on weights no older than its ``V_traj``
  and the staleness protocol is untouched (StaleFlow §4: migration does not change an entry).
- **Speculative state** (StaleFlow §5.2): an instance with migrations still in transit (sent
  away but not yet returned, or returned but not yet resumed) is left out of the next plan, so
  a stale snapshot never moves the same trajectories twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class InstanceSnapshot:
    """One instance as the coordinator sees it (StaleFlow's snapshot fields)."""

    index: int
    version: int  # installed weight version
    kv_used: float  # fraction of the KV cache in use
    running: int  # samples in the engine
    waiting: int  # samples queued on the instance
    alive: bool = True
    in_transit: int = 0  # migrations to or from it not yet resumed (speculative state)
    draining: bool = False  # a new version is staged: it admits nothing until its running work ends


@dataclass(frozen=True)
class Migrate:
    """Interrupt every trajectory on ``source`` and resume them on ``destination`` (same version)."""

    source: int
    destination: int
    version: int
    samples: int  # running on the source at the snapshot
    kv_used: float


@dataclass(frozen=True)
class RepackSettings:
    c_max: float = 0.99  # KV-cache fraction a destination may reach (Laminar: full above ~99%)
    batch_bound: int = 64  # roofline batch: samples one instance decodes with ~flat step time
    interval_s: float = 1.0  # periodic check (Laminar: 5 s on GPU clusters)

    def __post_init__(self) -> None:
        if not 0.0 < self.c_max <= 1.0:
            raise ValueError(f"c_max must be in (0, 1], got {self.c_max}")
        if self.batch_bound < 2:
            raise ValueError(
                f"batch_bound must be >= 2 (a destination holds its own and a source's), got {self.batch_bound}"
            )
        if self.interval_s < 0:
            raise ValueError(f"interval_s must be >= 0, got {self.interval_s}")


def ramping_down(s: InstanceSnapshot, kv_prev: float | None, settings: RepackSettings) -> bool:
    """Laminar's idleness metric (Algorithm 1, line 3) plus: nothing queued, something running."""
    return (s.alive and s.in_transit == 0 and s.waiting == 0 and 0 < s.running < settings.batch_bound
            and kv_prev is not None and s.kv_used < min(settings.c_max, kv_prev))


def best_fit(candidates: list[InstanceSnapshot], settings: RepackSettings) -> list[Migrate]:
    """Algorithm 1 over one version group: (source, destination) pairs that release the most sources."""
    order = sorted(candidates, key=lambda s: (s.kv_used, s.running, s.index))
    kv = {s.index: s.kv_used for s in order}
    n = {s.index: s.running for s in order}
    released: set[int] = set()
    receiving: set[int] = set()
    plan: list[Migrate] = []
    for s in order:
        if s.index in released or s.index in receiving:
            continue
        fits = [d for d in order if d.index != s.index and d.index not in released and not d.draining
                and kv[d.index] + s.kv_used <= settings.c_max and n[d.index] + s.running <= settings.batch_bound]
        if not fits:
            continue
        d = max(fits, key=lambda d: (kv[d.index] + s.kv_used, -d.index))  # fullest after the move
        plan.append(Migrate(s.index, d.index, s.version, s.running, s.kv_used))
        kv[d.index] += s.kv_used
        n[d.index] += s.running
        released.add(s.index)
        receiving.add(d.index)
    return plan


@dataclass
class RepackCoordinator:
    """The periodic repack check with its memory of each instance's previous KV use."""

    settings: RepackSettings = field(default_factory=RepackSettings)
    clock: Callable[[], float] = time.monotonic
    _kv_prev: dict[int, float] = field(default_factory=dict)
    _last: float | None = None
    checks: int = 0

    def due(self, force: bool = False) -> bool:
        """A check is due every ``interval_s`` (or at once when ``force``: after a weight update)."""
        return force or self._last is None or self.clock() - self._last >= self.settings.interval_s

    def plan(self, snapshots: list[InstanceSnapshot]) -> list[Migrate]:
        """Take a snapshot of every instance; return the migrations to carry out now."""
        self._last = self.clock()
        self.checks += 1
        groups: dict[int, list[InstanceSnapshot]] = {}
        for s in snapshots:
            if ramping_down(s, self._kv_prev.get(s.index), self.settings):
                groups.setdefault(s.version, []).append(s)
        self._kv_prev = {s.index: s.kv_used for s in snapshots if s.alive}
        return [m for version in sorted(groups) for m in best_fit(groups[version], self.settings)]
