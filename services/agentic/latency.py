"""Environment-latency injection for benchmarks (RollArt §8: per-turn latency N(10 s, σ 1..10 s)).

A ``LatencySampler`` draws one delay per environment step from the configured distribution:
``none`` (0), ``fixed`` (``mean_s`` every step) or ``normal`` (N(mean_s, std_s) truncated at 0 by
resampling, i.e. the normal conditioned on being >= 0; its mean is
``mu + sigma * phi(a) / (1 - Phi(a))`` with ``a = -mu / sigma``, above ``mu`` once sigma is not
small against mu). Each session owns a sampler seeded by the configured seed and the episode's
seed, so a trajectory's delays are reproducible whichever worker serves it and in whatever order
sessions interleave. The worker sleeps the drawn delay inside the step (off every other session's
thread); the sampler itself is pure.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.common.agentic_config import LatencyConfig

MAX_RESAMPLES = 1000  # mean >= 0 keeps P(x >= 0) >= 1/2: 1000 misses in a row do not happen


class LatencySampler:
    def __init__(self, cfg: LatencyConfig, stream: int = 0) -> None:
        self.cfg = cfg
        self._rng = random.Random(f"latency:{cfg.seed}:{stream}")

    def sample(self) -> float:
        c = self.cfg
        if c.kind == "none":
            return 0.0
        if c.kind == "fixed" or c.std_s == 0.0:
            return c.mean_s
        for _ in range(MAX_RESAMPLES):
            x = self._rng.gauss(c.mean_s, c.std_s)
            if x >= 0.0:
                return x
        return 0.0  # unreachable with mean_s >= 0 (see MAX_RESAMPLES)


def expected_mean(cfg: LatencyConfig) -> float:
    """The mean delay the sampler draws (the truncated normal's mean for ``normal``)."""
    if cfg.kind == "none":
        return 0.0
    if cfg.kind == "fixed" or cfg.std_s == 0.0:
        return cfg.mean_s
    a = -cfg.mean_s / cfg.std_s
    phi = math.exp(-a * a / 2) / math.sqrt(2 * math.pi)
    tail = 0.5 * math.erfc(a / math.sqrt(2))  # 1 - Phi(a)
    return cfg.mean_s + cfg.std_s * phi / tail
