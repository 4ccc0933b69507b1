"""An agentic trainer's rollout machinery and its held-out evaluation.

``build_rollout`` wires what the trainer process was given (SGS clients, environment worker
addresses, a reward scorer) into a ``services.agentic.rollout.Rollout``. ``evaluate`` runs the
held-out episodes (``eval.prompts`` of them, fixed by ``eval.seed``) at the trainer's current
version, one trajectory each at the training temperature, and scores them by the environment's
own reward: accuracy is the fraction of episodes solved (reward 1), with its binomial standard
error and a breakdown by the episode's difficulty (the calculator's subtraction steps, the
walk's distance). The reward service is not asked: evaluation measures task success, whatever
reward (a learned model, say) training optimises.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from services.agentic.episodes import Episode
from services.agentic.manager import Limits
from services.agentic.registry import ENVIRONMENTS
from services.agentic.rollout import EnvPool, Rollout, RolloutLoop, Scorer
from services.agentic.runner import PolicyCodec, SgsGenerator
from services.agentic.trajectory import Trajectory
from services.common.config import RunConfig
from services.generation.scheduling.pools import eligible_instances
from services.run.evaluate import EvalResult, summarize

EXTRA_THREADS = 16  # beyond the concurrency: evaluation, session closes


def build_rollout(cfg: RunConfig, policy, clients, env_addresses: list[str],
                  scorer: Callable[[ThreadPoolExecutor], Scorer], fleet=None) -> Rollout:
    """``scorer(executor)``: the reward scorer, its blocking calls on the rollout's thread pool;
    ``fleet``: the run's table of ``clients`` (``services.rollout.fleet``; default: the generator's own)."""
    a = cfg.agentic
    executor = ThreadPoolExecutor(max_workers=2 * a.concurrency + EXTRA_THREADS, thread_name_prefix="agentic")
    envs = EnvPool.connect(env_addresses, executor)
    envs.wait_ready()
    direct = not cfg.uses_router  # the instances themselves, not one router in front of them
    eligible = ((lambda task, n: eligible_instances(task, cfg.generation, range(n)))
                if direct and cfg.generation.affinity else None)
    generator = SgsGenerator(clients, executor, temperature=cfg.generation.temperature, tag="agentic",
                             eligible=eligible, fleet=fleet)
    if a.agent is not None:  # episodes played by the user's agent through the OpenAI-compatible gateway
        from services.gateway.setup import agent_rollout

        return agent_rollout(cfg, policy, generator, envs, executor)
    return Rollout(loop=RolloutLoop(), generator=generator, envs=envs, codec=PolicyCodec(policy),
                   limits=Limits.from_config(a), scorer=scorer(executor), executor=executor)


def difficulty(cfg: RunConfig, episode: Episode) -> int:
    env = ENVIRONMENTS[episode.kind].from_config(cfg.agentic)
    env.reset(episode.seed)
    return env.difficulty


def fingerprint(episodes: list[Episode]) -> str:
    """Identifies the held-out set (runs compare accuracies only on the same set)."""
    text = "\n".join(f"{e.kind}:{e.seed}" for e in episodes)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def score(cfg: RunConfig, episodes: list[Episode], trajs: list[Trajectory], version: int) -> EvalResult:
    outcomes = [(difficulty(cfg, e), float(t.reward >= 1.0)) for e, t in zip(episodes, trajs, strict=True)]
    return summarize(outcomes, version, sum(t.generated_tokens for t in trajs) / len(trajs))


def evaluate(rt, rollout: Rollout, episodes: list[Episode], tag: str) -> EvalResult:
    t0 = time.time()
    rt.publisher.wait(rt.version)
    trajs = rollout.evaluate(episodes, rt.version, rt.cfg.agentic.concurrency, tag=tag)
    rt.timeline["eval"].append([-1, t0, time.time()])
    return score(rt.cfg, episodes, trajs, rt.version)
