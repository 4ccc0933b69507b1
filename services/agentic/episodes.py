"""Episode seeds: the held-out evaluation episodes and the training stream that avoids them.

An environment episode is fixed by (kind, config, seed). Evaluation takes ``eval.prompts`` seeds
drawn once from ``eval.seed``; training draws seeds from its own stream (``task.seed``), the warm
start from another (``warmstart.seed``). For kinds whose episodes are many (the calculator's
count-down problems), a training seed whose first observation is one of the held-out episodes'
is skipped, so no evaluation problem is ever trained on, whatever seed produced it. Kinds with
few distinct episodes (``Environment.held_out_by_observation`` False: the walk's 90 start/target
pairs) skip nothing: every evaluation episode is also a training episode there.

Pure and deterministic; ``EpisodeStream.state``/``restore`` carry the cursor through a trainer
restart (the recovery checkpoint's data cursor).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from services.agentic.registry import ENVIRONMENTS
from services.common.agentic_config import AgenticConfig

SEED_SPACE = 2**31 - 1
MAX_SKIPS = 100_000  # held-out collisions in a row: the held-out set covers (nearly) every episode


@dataclass(frozen=True)
class Episode:
    kind: str
    seed: int


def first_observation(cfg: AgenticConfig, kind: str, seed: int) -> str:
    return ENVIRONMENTS[kind].from_config(cfg).reset(seed).text


def eval_episodes(cfg: AgenticConfig, seed: int, n: int) -> list[Episode]:
    """The ``n`` held-out episodes of ``cfg.env`` fixed by ``seed`` (distinct seeds)."""
    rng = random.Random(f"agentic-eval:{cfg.env}:{seed}")
    return [Episode(cfg.env, s) for s in rng.sample(range(SEED_SPACE), n)]


class EpisodeStream:
    """Training episodes of ``cfg.env``: seeds from ``seed``'s stream, held-out ones skipped."""

    def __init__(self, cfg: AgenticConfig, seed: int, held_out: Iterable[Episode] = (), *, tag: str = "train") -> None:
        self.cfg, self.kind = cfg, cfg.env
        self._rng = random.Random(f"agentic-{tag}:{cfg.env}:{seed}")
        self.drawn = 0
        env_cls = ENVIRONMENTS[self.kind]
        self._held_seeds = {e.seed for e in held_out}
        self._held_obs = ({first_observation(cfg, e.kind, e.seed) for e in held_out}
                          if env_cls.held_out_by_observation else set())

    def next(self) -> Episode:
        for _ in range(MAX_SKIPS):
            seed = self._rng.randrange(SEED_SPACE)
            self.drawn += 1
            if seed in self._held_seeds:
                continue
            if self._held_obs and first_observation(self.cfg, self.kind, seed) in self._held_obs:
                continue
            return Episode(self.kind, seed)
        raise RuntimeError(f"{MAX_SKIPS} training seeds in a row were held-out {self.kind} episodes: "
                           f"fewer eval episodes (eval.prompts) or a wider task distribution")

    def take(self, n: int) -> list[Episode]:
        return [self.next() for _ in range(n)]

    def state(self) -> dict:
        return {"rng": self._rng.getstate(), "drawn": self.drawn}

    def restore(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))
        self.drawn = state["drawn"]
