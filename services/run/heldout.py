"""Held-out evaluation: the one code path of a run's evaluations and of ``braid eval``.

``HeldOut`` is what scoring the held-out set needs: the config, the policy's tokenizer side (prompt
encoding, completion decoding), the SGS clients, the reward service's client (single-turn runs) or
the rollout (agentic runs), and the weight version the SGS serves. ``evaluate(tag)`` sends every
held-out prompt once (``services.rollout.collect``: the instances' shares, one Generate call each,
at the service's temperature ``generation.temperature``, seeded with ``eval.seed``), has each
sample scored by the reward service as it streams in, and summarises (``evaluate.score``: accuracy,
its binomial standard error, the breakdown by difficulty or by the dataset's group field). An
agentic run plays its held-out episodes instead (``services.rollout.agentic_setup.evaluate``;
unseeded: its turns draw from the engines' generators).

The held-out set is the first of the run's evaluation suites (``services.run.suites``: ``eval.suites``
follow it); ``evaluate_suite`` scores any of them the same way, at the suite's own temperature and
answer length, and ``evaluate`` is the held-out one's.

The trainer runtime (``runtime.TrainerRuntime``) is a ``HeldOut`` whose version moves with each
step and whose publisher waits until the SGS serves it; ``braid eval`` (``flows/eval_cli.py``)
makes one over a fresh SGS serving a checkpoint, version 0, nothing to wait for. Every evaluation
request carries ``eval.seed`` (``GenerateParams.seed``): the SGS gives each held-out prompt a seed
of its own, derived from it and the prompt's id (``services.generation.core.request_seed``), and
samples it from a generator of its own, not from the engine's generator that training rollouts
advance. So the same weights give the same samples in every evaluation: ``braid eval`` of a run's
``final/`` reproduces the run's final evaluation sample for sample (and of its start checkpoint,
the warm-start evaluation), and the warm-start and final evaluations of a run are paired by prompt
and seed. Training rollouts stay unseeded (a group's samples must differ).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from services.common.config import RunConfig
from services.common.types import GenerateParams, PromptSpec, SampleRecord
from services.rollout.collect import collect
from services.rollout.fleet import HOLDS_WORK, fleet_of
from services.rollout.modes import fleet_capacity
from services.rollout.rewards import Outcome
from services.run.evaluate import EvalResult, score
from services.run.suites import Suite, answers_path, build_suites, write_answers
from services.tasks.source import TaskItem, build_task


class Served:
    """The publisher of an SGS that serves its checkpoint as it is: version 0 is there already."""

    def wait(self, version: int) -> None:
        return None


class HeldOut:
    """The held-out set of ``cfg`` and how to score it on ``clients`` (see the module docstring)."""

    rollout = None  # agentic runs: their ``services.agentic.rollout.Rollout``

    def __init__(self, cfg: RunConfig, policy, clients: list, rewards=None) -> None:
        """``policy``: encodes prompts and decodes completions (``services.policy.model.Policy``; its
        model is not used); ``rewards``: the reward service's client of a single-turn run."""
        self.cfg = cfg
        self.policy = policy
        self.clients = clients
        # the run's one table of its instances, rows index for index with ``clients``: training routes
        # on it and evaluation picks on it (real versions and capacity, ``collect``)
        self.fleet = fleet_of([c.address for c in clients], fleet_capacity(cfg, len(clients)))
        self.rewards = rewards
        self.version = 0
        self.task = build_task(cfg.task, cfg.eval)
        self.eval_set = self.task.eval_set
        # the held-out split first, then eval.suites (an agentic run plays its episodes: no suites)
        self.suites: list[Suite] = [] if cfg.agentic.enabled else build_suites(
            cfg, self.eval_set, self.eval_fingerprint())
        self.answers_dir: Path | None = None  # where each evaluation's answers go (``suites.write_answers``)
        self.problems: dict[str, TaskItem] = {}
        self.publisher = Served()
        self.timeline: dict[str, list[list[float]]] = {"generation": [], "training": [], "eval": []}

    def prompt_specs(self, problems: list[TaskItem], forced_length: int = 0,
                     estimates: list[float] | None = None) -> list[PromptSpec]:
        """The wire prompts (``estimates``: estimated output lengths the instance admits LPT by; 0 = none)."""
        for p in problems:
            self.problems[p.prompt_id] = p
        return [
            PromptSpec(p.prompt_id, tuple(self.policy.encode_prompt(p.prompt, p.system)), estimated_length=e,
                       forced_length=forced_length, task=p.task)
            for p, e in zip(problems, estimates or [0.0] * len(problems), strict=True)
        ]

    def score(self, sample: SampleRecord) -> Future[Outcome]:
        """The sample's reward from the reward service, as a future (``services.rollout.rewards``)."""
        if self.rewards is None:
            raise RuntimeError("the trainer has no reward service client (the launcher passes --reward-membership)")
        return self.rewards.submit(self.problems[sample.prompt_id], sample, self.policy.decode(list(sample.token_ids)))

    def evaluate(self, tag: str, progress: Callable[[int], None] | None = None) -> EvalResult:
        """Score the held-out set at ``version``; ``progress(n)`` after each of the n samples
        received (single-turn runs)."""
        if self.cfg.agentic.enabled:
            from services.rollout.agentic_setup import evaluate

            return evaluate(self, self._rollout(), self.agentic_eval, tag)
        return self.evaluate_suite(self.suites[0], tag, progress)

    def evaluate_suite(self, suite: Suite, tag: str, progress: Callable[[int], None] | None = None) -> EvalResult:
        """Score one suite (``services.run.suites``; the first is the held-out set) at ``version``: each
        prompt once at the suite's temperature and answer length, seeded; ``progress`` as ``evaluate``'s."""
        t0 = time.time()
        self.publisher.wait(self.version)
        for i in self.fleet.snapshot().in_state(*HOLDS_WORK):  # what ``wait`` saw staged on every live one
            self.fleet.record_version(i, self.version)
        params = GenerateParams(1, suite.max_new_tokens, self.version, tag=tag, temperature=suite.wire_temperature,
                                seed=self.cfg.eval.seed)  # seeded: see the docstring
        stream = collect(self.clients, self.prompt_specs(suite.items), params, self.fleet)
        pending = []
        for sample in stream:  # scored as they stream in
            pending.append((sample, self.score(sample)))
            if progress is not None:
                progress(len(pending))
        samples = [s for s, _ in pending]
        outcomes = [f.result() for _, f in pending]
        self.timeline["eval"].append([-1, t0, time.time()])
        if self.answers_dir is not None:
            write_answers(answers_path(self.answers_dir, suite.name, self.version), samples, outcomes,
                          [self.policy.decode(list(s.token_ids)) for s in samples])
        return score(suite.items, samples, outcomes, self.version)

    @property
    def eval_size(self) -> int:
        """How many held-out prompts (or episodes) ``evaluate`` scores."""
        return len(self.agentic_eval) if self.cfg.agentic.enabled else len(self.eval_set)

    @property
    def agentic_eval(self):
        """The held-out episodes of an agentic run (``eval.prompts``, fixed by ``eval.seed``)."""
        from services.agentic.episodes import eval_episodes

        return eval_episodes(self.cfg.agentic, self.cfg.eval.seed, self.cfg.eval.prompts)

    def eval_fingerprint(self) -> str:
        """Identifies the held-out set (accuracies compare only on the same set)."""
        if not self.cfg.agentic.enabled:
            from services.tasks.arith import fingerprint

            return fingerprint(self.eval_set)
        from services.rollout.agentic_setup import fingerprint

        return fingerprint(self.agentic_eval)

    def _rollout(self):
        if self.rollout is None:
            raise RuntimeError("agentic.enabled: the trainer needs its rollout (environment workers; --env-workers)")
        return self.rollout


def tokenizer_policy(path: str | Path, chat_template: bool):
    """The tokenizer side of the checkpoint at ``path`` as a ``Policy`` (no weights loaded: the
    SGS holds them), its EOS made the config's as ``services.policy.model.load_policy`` makes it."""
    from services.generation.checkpoint import inspect_checkpoint
    from services.policy.model import Policy, load_tokenizer

    eos_ids = inspect_checkpoint(path).eos_ids
    tok = load_tokenizer(path)
    if tok.eos_token_id is None and eos_ids:  # samples end on the config's EOS
        tok.eos_token = tok.convert_ids_to_tokens(eos_ids[0])
    if eos_ids and tok.eos_token_id not in eos_ids:
        raise ValueError(f"{path}: the tokenizer's eos token id {tok.eos_token_id} is not among config.json's "
                         f"eos_token_id {list(eos_ids)}")
    if chat_template and not tok.chat_template:
        raise ValueError(f"{path}: model.chat_template is on but the checkpoint's tokenizer has no chat template")
    return Policy(model=None, tokenizer=tok, chat_template=chat_template)


def build_agentic(cfg: RunConfig, policy, clients, env_workers: list[str], reward_membership: str, fleet=None):
    """The rollout machinery of an agentic run (``services.rollout.agentic_setup``): rewards from
    the reward pool whose membership file the launcher keeps; ``fleet``: the run's table of
    ``clients`` (the turns pick on it)."""
    from services.agentic.rollout import ServiceScorer
    from services.reward.client import RewardPool
    from services.rollout.agentic_setup import build_rollout

    def scorer(executor):
        return ServiceScorer(RewardPool.from_config(cfg.reward, membership=Path(reward_membership)), executor)

    return build_rollout(cfg, policy, clients, env_workers, scorer, fleet)


def single_turn_rewards(cfg: RunConfig, reward_membership: str, run_dir: Path):
    """The reward service's client of a single-turn run (``services.rollout.rewards``)."""
    from services.reward.client import RewardPool
    from services.rollout.rewards import ServiceRewards

    return ServiceRewards(RewardPool.from_config(cfg.reward, membership=Path(reward_membership)), run_dir,
                          threads=min(cfg.reward.threads, 16))
