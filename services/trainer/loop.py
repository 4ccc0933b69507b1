"""The RL trainer: consumes SGS sample streams, takes GRPO steps, publishes weights.

Pipeline modes (``trainer.mode``):

- ``sequential`` — the naive baseline: generate the whole batch, then train on it.
- ``sync`` — on-policy. Each iteration's prompts are generated with the current weights
  (``min_weight_version``), and the trainer runs forward/backward on complete groups as they
  stream in, so training overlaps the generation tail (StreamRL's dynamic-batch pipelining).
  One optimizer step per iteration: micro-batches accumulate gradients.
- ``one_step`` — generation of iteration k+1 is requested before training on iteration k
  starts, with the weights the trainer had then, so the stages overlap fully and every sample
  is at most one version stale (StreamRL's one-step asynchronous pipelining). The clipped
  importance ratio uses the behaviour log-probs the SGS reported.

Weights leave through ``WeightPublisher`` (background push through the configured weight
transport: the relay plane or direct streams), so the trainer stalls only for a snapshot copy. Every iteration appends a line to ``metrics.jsonl``; the stage intervals go to
``timeline.json``; evaluation before and after RL goes to ``summary.json``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from services.common.config import RunConfig
from services.common.types import GenerateParams, PromptSpec, SampleRecord
from services.generation.client import GenerationClient
from services.policy.model import Policy, save_policy
from services.tasks.arith import Problem, ProblemSampler, eval_problems, reward
from services.trainer.batching import DynamicBatcher
from services.trainer.evaluate import EvalResult, score
from services.trainer.learner import Group, Learner, StepStats
from services.trainer.parallel import Leader, ParallelContext
from services.trainer.streams import SampleStream, WeightPublisher
from services.trainer.timeline import idle


@dataclass
class Accumulator:
    samples: int = 0
    tokens: int = 0
    rewards: float = 0.0
    correct: int = 0
    lengths: list[int] = field(default_factory=list)
    staleness: list[int] = field(default_factory=list)
    gen_first_start: float = float("inf")
    gen_last_finish: float = 0.0


class RLTrainer:
    def __init__(
        self, cfg: RunConfig, policy: Policy, clients: list[GenerationClient], run_dir: Path, transport=None,
        parallel: ParallelContext | None = None,
    ) -> None:
        tc = cfg.trainer
        torch.set_num_threads(tc.threads)
        torch.manual_seed(tc.seed)
        self.cfg = cfg
        self.policy = policy
        learner = Learner(cfg, policy, parallel)  # rank 0 of a data-parallel trainer leads the others
        self.learner = learner if parallel is None else Leader(learner, parallel)
        self.model = self.learner.model
        self.clients = clients
        self.run_dir = run_dir
        self.version = 0
        dist = cfg.task.distribution()
        self.eval_set = eval_problems(cfg.eval.seed, cfg.eval.prompts, **dist)
        held_out = frozenset(p.prompt for p in self.eval_set)
        self.sampler = ProblemSampler(cfg.task.seed, exclude=held_out, **dist)  # type: ignore[arg-type]
        self.problems: dict[str, Problem] = {}
        self._rewards: dict[tuple[str, int], float] = {}  # scored on arrival, used when the group completes
        self.publisher = WeightPublisher(clients, tc.chunk_bytes, transport)
        self.gen_busy: list[tuple[float, float]] = []
        self.timeline: dict[str, list[list[float]]] = {"generation": [], "training": [], "eval": []}
        self.metrics_path = run_dir / "metrics.jsonl"

    # ------------------------------------------------------------------ requests
    def prompt_specs(self, problems: list[Problem], forced_length: int = 0) -> list[PromptSpec]:
        for p in problems:
            self.problems[p.prompt_id] = p
        return [
            PromptSpec(p.prompt_id, tuple(self.policy.encode_prompt(p.prompt)), forced_length=forced_length)
            for p in problems
        ]

    def request(self, iteration: int, min_version: int) -> SampleStream:
        problems = self.sampler.batch(self.cfg.trainer.prompts_per_iteration)
        params = GenerateParams(self.cfg.trainer.group_size, 0, min_version, tag=f"iter-{iteration}")
        forced = self.cfg.forced_length_ramp.length(iteration)  # 0 unless a length ramp is configured (bench/scaleout.py)
        return SampleStream(self.clients, self.prompt_specs(problems, forced), params)

    def evaluate(self, tag: str) -> EvalResult:
        t0 = time.time()
        self.publisher.wait(self.version)
        stream = SampleStream(self.clients, self.prompt_specs(self.eval_set), GenerateParams(1, 0, self.version, tag=tag))
        samples = list(stream)
        self.timeline["eval"].append([-1, t0, time.time()])
        return score(self.eval_set, samples, self.policy, self.version)

    # ------------------------------------------------------------------ training
    def run_iterations(self, progress=None) -> None:
        mode = self.cfg.trainer.mode
        n = self.cfg.trainer.iterations
        if mode == "bounded":
            from services.trainer.bounded import BoundedRunner

            BoundedRunner(self).run(n, progress)
            return
        streams = {0: self.request(0, self.version)}
        for k in range(n):
            if mode == "one_step" and k + 1 < n:
                streams[k + 1] = self.request(k + 1, self.version)
            stats = self.train_on(streams.pop(k), k)
            if mode != "one_step" and k + 1 < n:
                streams[k + 1] = self.request(k + 1, self.version)
            if progress is not None:
                progress(k, stats)
        self.publisher.wait(self.version)

    def train_on(self, stream: SampleStream, iteration: int) -> dict:
        tc = self.cfg.trainer
        t_start = time.time()
        acc = Accumulator()
        stats = self.learner.begin()
        batcher = DynamicBatcher(tc.group_size, tc.micro_batch_groups)
        source = list(stream) if tc.mode == "sequential" else stream
        for sample in source:
            self._observe(sample, acc)
            groups = batcher.add(sample)
            if groups:
                self.learner.backward([self._rewarded(g) for g in groups])
        groups = batcher.flush()
        if groups:
            self.learner.backward([self._rewarded(g) for g in groups])
        if batcher.incomplete:
            raise RuntimeError(f"iteration {iteration}: {batcher.incomplete} groups incomplete at end of stream")
        grad_norm = self.learner.step()
        self.version += 1
        t0 = time.time()
        stall = self.publisher.publish(self.learner.weights(), self.version)
        stats.busy.append((t0, time.time()))
        self.maybe_checkpoint()
        return self.record(iteration, t_start, time.time(), acc, stats, grad_norm, stall)

    def _rewarded(self, samples: list[SampleRecord]) -> Group:
        return Group(samples, [self._rewards.pop((s.prompt_id, s.sample_index)) for s in samples])

    def maybe_checkpoint(self) -> None:
        """Every ``checkpoint_every`` versions, save the policy (for offline evaluation over time)."""
        every = self.cfg.trainer.checkpoint_every
        if every and self.version % every == 0:
            out = self.run_dir / "checkpoints" / f"v{self.version:05d}"
            # the backend's full weights (gathered when sharded, converted from Megatron's layout)
            save_policy(self.policy, out, self.learner.weights().host_copies())
            with (self.run_dir / "checkpoints" / "index.jsonl").open("a") as f:
                f.write(json.dumps({"version": self.version, "path": str(out), "time": time.time()}) + "\n")

    def score(self, sample: SampleRecord) -> float:
        return reward(self.problems[sample.prompt_id], self.policy.decode(list(sample.token_ids)))

    def _observe(self, sample: SampleRecord, acc: Accumulator) -> None:
        r = self.score(sample)
        self._rewards[(sample.prompt_id, sample.sample_index)] = r
        self.tally(sample, r, self.version - sample.weight_version, acc)

    def tally(self, sample: SampleRecord, r: float, staleness: int, acc: Accumulator) -> None:
        acc.samples += 1
        acc.tokens += len(sample.token_ids)
        acc.rewards += r
        acc.correct += int(r == 1.0)
        acc.lengths.append(len(sample.token_ids))
        acc.staleness.append(staleness)
        acc.gen_first_start = min(acc.gen_first_start, sample.started_at)
        acc.gen_last_finish = max(acc.gen_last_finish, sample.finished_at)
        self.gen_busy.append((sample.started_at, sample.finished_at))

    # ------------------------------------------------------------------ metrics
    def record(
        self, k: int, t_start: float, t_end: float, acc: Accumulator, st: StepStats, grad_norm: float, stall: float,
        extra: dict | None = None,
    ) -> dict:
        window = (t_start, t_end)
        wall = t_end - t_start
        mb = max(1, st.micro_batches)
        row = {
            "iteration": k,
            "mode": self.cfg.trainer.mode,
            "weight_version": self.version,
            "reward_mean": acc.rewards / acc.samples,
            "accuracy": acc.correct / acc.samples,
            "samples": acc.samples,
            "trained_samples": st.trained_samples,
            "zero_advantage_groups": st.zero_adv_groups,
            "loss": st.loss,
            "clip_fraction": st.clip_fraction / mb,
            "kl": st.kl / mb,
            "is_weight_mean": st.is_weight / mb,
            "is_capped_fraction": st.is_capped / mb,
            "value_loss": st.value_loss,
            "filtered_groups": st.filtered_groups,
            "grad_norm": grad_norm,
            "gen_time_s": acc.gen_last_finish - acc.gen_first_start,
            "gen_first_start": acc.gen_first_start,  # absolute (epoch s): the scale-out controller's T_gen
            "gen_last_finish": acc.gen_last_finish,
            "train_time_s": sum(e - s for s, e in st.busy),
            "iteration_time_s": wall,
            "idle_gen_s": idle(self.gen_busy, window),
            "idle_train_s": idle(st.busy, window),
            "samples_per_s": acc.samples / wall,
            "tokens_per_s": acc.tokens / wall,
            "response_len_mean": sum(acc.lengths) / len(acc.lengths),
            "response_len_max": max(acc.lengths),
            "response_lens": list(acc.lengths),  # per sample, for the report's length distribution
            "staleness_mean": sum(acc.staleness) / len(acc.staleness),
            "staleness_max": max(acc.staleness),
            "push_stall_s": stall,
            "t_start": t_start,
            "t_end": t_end,
            **(extra or {}),
        }
        self.timeline["generation"].append([k, acc.gen_first_start, acc.gen_last_finish])
        self.timeline["training"].extend([[k, s, e] for s, e in st.busy])
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        return row

    def write_timeline(self) -> None:
        (self.run_dir / "timeline.json").write_text(json.dumps(self.timeline) + "\n")
