"""The warm start's accuracy check: how often the policy being fine-tuned solves the task.

A fixed number of SFT steps lands wherever the CPU's numerics take it: the same 300 steps of the
default config scored 0.278 held-out in the run of record (642b718, a 2-core AMD EPYC whose
vector features were not recorded, 139 samples/s) and 0.174 on a 2-core AMD EPYC without AVX-512
(52.5 samples/s; issue 52), because the small model is still on the steep part of its learning
curve there and floating-point differences move it along. ``warmstart.target_accuracy``
stops the SFT at the first check that reaches the target instead, so every CPU starts RL from
the same accuracy (to within a check's step and its sampling error).

A check samples one completion for each of ``warmstart.check_prompts`` prompts of the training
distribution (never held-out ones: the task's samplers exclude them; a sampler seeded apart from
the demonstrations), at ``generation.temperature`` up to ``generation.max_new_tokens`` tokens, on
the run's own engine (``generation.engine``: vLLM by default, the engine that scores the run's
held-out set), started once in this process from the policy as the SFT began and given the
policy's current weights before each check; and scores each completion with the run's reward
(``reward.kind`` built in this process: the verdict ``correct`` the reward service gives). The
prompts are the same at every check and each is sampled with a seed of its own (from
``warmstart.seed``), so a check is a function of the weights: on one machine the same warm start
stops at the same step every time.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass

import torch

from services.common.config import RunConfig
from services.generation.engine import Engine, EngineOutput, Sampling, create_engine
from services.policy.model import Policy, save_policy
from services.tasks.source import TaskItem, build_task, reward_request

CHECK_SEED_OFFSET = 1_000_003  # the checks' prompts: a stream of their own, apart from the demonstrations'
POLL_S = 0.05


@dataclass(frozen=True)
class Check:
    step: int  # SFT steps taken before it
    accuracy: float
    prompts: int
    reached: bool  # accuracy >= the target
    seconds: float


class AccuracyCheck:
    """``check(policy, step)``: the policy's accuracy on a fixed sample of training prompts, against
    ``warmstart.target_accuracy``. A context manager: the engine it starts is closed on exit."""

    def __init__(self, cfg: RunConfig, policy: Policy) -> None:
        from services.reward.registry import REWARD_KINDS

        ws, gen = cfg.warmstart, cfg.generation
        if ws.target_accuracy is None:
            raise ValueError("an accuracy check needs warmstart.target_accuracy")
        self.target = ws.target_accuracy
        task = build_task(cfg.task.model_copy(update={"seed": ws.seed + CHECK_SEED_OFFSET}), cfg.eval)
        self.items: list[TaskItem] = task.sampler.batch(ws.check_prompts)
        self.prompts = [policy.encode_prompt(i.prompt, i.system) for i in self.items]
        self.reward = REWARD_KINDS[cfg.reward.kind](cfg)
        self.max_new_tokens = gen.max_new_tokens
        self.seed = ws.seed
        self._dir = tempfile.TemporaryDirectory(prefix="braid-warmcheck-")
        save_policy(policy, self._dir.name)  # the engine starts from the policy as it is now
        threads = torch.get_num_threads()  # an engine may set its own (generation.threads): the SFT keeps its
        self.engine: Engine = create_engine(gen.engine, self._dir.name, gen)
        torch.set_num_threads(threads)
        self.temperature = gen.temperature

    def __enter__(self) -> AccuracyCheck:
        return self

    def __exit__(self, *exc: object) -> None:
        self.engine.close()
        self._dir.cleanup()

    def __call__(self, policy: Policy, step: int) -> Check:
        t0 = time.monotonic()
        specs = self.engine.param_specs()
        with torch.no_grad():
            self.engine.load_weights({k: v.detach().clone() for k, v in policy.model.state_dict().items()
                                      if k in specs})
        texts = [policy.decode(out.token_ids) for out in self._generate()]
        correct = sum(self._correct(item, text, i) for i, (item, text) in enumerate(zip(self.items, texts,
                                                                                       strict=True)))
        accuracy = correct / len(self.items)
        return Check(step, accuracy, len(self.items), accuracy >= self.target, round(time.monotonic() - t0, 2))

    def _generate(self) -> list[EngineOutput]:
        """One sample per check prompt, in prompt order."""
        for i, prompt in enumerate(self.prompts):
            sampling = Sampling(temperature=self.temperature, seed=self.seed * CHECK_SEED_OFFSET + i)
            self.engine.submit(f"check-{i}", prompt, self.max_new_tokens, sampling=sampling)
        done: dict[str, EngineOutput] = {}
        while len(done) < len(self.prompts):
            for out in self.engine.poll(POLL_S):
                if out.error is not None:
                    raise RuntimeError(f"the warm start's accuracy check: request {out.request_id} failed: {out.error}")
                done[out.request_id] = out
        return [done[f"check-{i}"] for i in range(len(self.prompts))]

    def _correct(self, item: TaskItem, completion: str, i: int) -> bool:
        scored = self.reward.score(reward_request(item, completion, f"warmcheck-{i}"))
        return scored.info.get("correct") == "true"
