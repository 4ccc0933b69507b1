"""What every pipeline-mode runner works with: the trainer's state and the steps they share.

``TrainerRuntime`` holds the run (config, policy, learner, SGS clients, weight publisher, the
current weight version, the task's prompt sampler and held-out set, the stage timeline, the
metrics file) and the steps every mode takes: prompt specs, scoring, tallying a trained sample,
``step_and_snapshot`` (the optimizer step, version + 1, the weights copied out through the
weight transport, the checkpoint when due), recording an iteration's metrics, evaluation. Prompt
specs, scoring and evaluation are ``heldout.HeldOut``'s, the code ``braid eval`` runs too; when the
suites are scored (warm start, between steps, end) is ``evaluations.Evaluations``'.

The rollout orchestrator (``services.rollout.orchestrator``, every single-turn mode) and the
multi-turn runner (``services.rollout.agentic``) work over this one interface.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from services.common.config import RunConfig
from services.common.lora import save_adapter
from services.common.types import SampleRecord
from services.generation.client import GenerationClient
from services.policy.model import Policy, save_policy
from services.rollout.publisher import WeightPublisher
from services.rollout.rewards import Outcome, ServiceRewards
from services.run.evaluations import Evaluations
from services.run.heldout import HeldOut
from services.run.suites import ANSWERS_DIR
from services.run.timeline import idle
from services.trainer.learner import Learner, StepStats
from services.trainer.parallel import Leader, ParallelContext


@dataclass
class Accumulator:
    samples: int = 0
    tokens: int = 0
    rewards: float = 0.0
    correct: int = 0
    reward_failures: int = 0
    lengths: list[int] = field(default_factory=list)
    staleness: list[int] = field(default_factory=list)
    gen_first_start: float = float("inf")
    gen_last_finish: float = 0.0


@dataclass(frozen=True)
class Published:
    """One optimizer step's outcome: the version's transport snapshot, the gradient norm, the
    trainer's stall while the weights were copied out."""

    version: int
    snapshot: object
    grad_norm: float
    stall_s: float


class TrainerRuntime(HeldOut):
    def __init__(
        self, cfg: RunConfig, policy: Policy, clients: list[GenerationClient], run_dir: Path, transport=None,
        parallel: ParallelContext | None = None, rewards: ServiceRewards | None = None, learner=None,
    ) -> None:
        """``learner``: one running elsewhere (``services.run.learner_process``); default, one in this process."""
        tc = cfg.trainer
        torch.set_num_threads(tc.threads)
        torch.manual_seed(tc.seed)
        super().__init__(cfg, policy, clients, rewards)  # the held-out set and how it is scored
        if learner is None:
            learner = Learner(cfg, policy, parallel)  # rank 0 of a data-parallel trainer leads the others
            learner = learner if parallel is None else Leader(learner, parallel)
        self.learner = learner
        self.run_dir = run_dir
        self.sampler = self.task.sampler
        # evaluation waits for its version; the table says whom to offer to and wait for (a failed push loses its row)
        self.publisher = WeightPublisher(clients, tc.chunk_bytes, transport, fleet=self.fleet)
        self.gen_busy: list[tuple[float, float]] = []
        self.metrics_path = run_dir / "metrics.jsonl"
        self.answers_dir = run_dir / ANSWERS_DIR  # every evaluation's answers (services.run.suites)
        self.evaluations = Evaluations(self, run_dir)  # warm start, between steps, end; the forgetting check
        # recovery (services.run.resume): set by ``open_recovery``
        self.attempt = 0
        self.ledger = None  # services.run.ledger.Ledger once open
        self.runner_state: dict | None = None  # the runner's part of the checkpoint resumed from
        self.start_snapshot = None  # the resumed version's weights as published again
        self.resumed_version = 0
        self.model_dir: str | None = None  # the checkpoint the run started from (a cost-aware dispatch policy's model)
        # how to dial an SGS instance that joins the run (the trainer process sets its TLS)
        self.connect = lambda address: GenerationClient(address, max_message_mb=cfg.generation.max_message_mb)
        self._recovering: tuple[float | None, float] | None = None  # (death seen at, this process's start)

    def open_recovery(self, attempt: int, died_at: float | None = None, started_at: float | None = None) -> bool:
        """Resume from the newest recovery checkpoint when there is one or this is a restart
        (``attempt`` > 0; ``died_at``: when the launcher saw the last attempt die), and open the
        consumption ledger. Returns True when the run resumed."""
        from services.run.resume import resume

        self.attempt = attempt
        resumed = resume(self, attempt)
        self.resumed_version = self.version
        if attempt:
            self._recovering = (died_at, started_at or time.time())
        return resumed

    def recovery_due(self, version: int) -> bool:
        """Whether the step to ``version`` saves a recovery checkpoint (every ``trainer.recovery.every``)."""
        every = self.cfg.trainer.recovery.every
        return bool(every) and version % every == 0

    def save_recovery(self, runner_state: dict) -> None:
        """A recovery checkpoint at this version (``runner_state``: the rollout's part, its data
        cursor under ``sampler``, captured when the step's buffer was consumed)."""
        from services.run.resume import save

        save(self, runner_state)

    def step_and_snapshot(self, stats: StepStats, offer: bool, consumed: list | None = None) -> Published:
        """The batch's optimizer step (``consumed``: its groups, recorded in the ledger first);
        version + 1; the weights copied out through the transport (offered to every instance when
        ``offer``: the bounded runner offers lazily); a checkpoint when due."""
        if self.ledger is not None and consumed is not None:
            self.ledger.consume(self.version + 1, consumed)
        grad_norm = self.learner.step()
        self.version += 1
        if self._recovering is not None:
            from services.run.resume import record_recovery

            record_recovery(self, *self._recovering)
            self._recovering = None
        t0 = time.time()
        snap = self.publisher.snapshot(self.learner.weights(), self.version)
        if offer:
            self.publisher.offer(self.version, snap)
        stall = time.time() - t0
        stats.busy.append((t0, time.time()))
        self.maybe_checkpoint()
        return Published(self.version, snap, grad_norm, stall)

    def maybe_checkpoint(self) -> None:
        """Every ``checkpoint_every`` versions, save the policy (for offline evaluation over time):
        a Hugging Face checkpoint, or with ``trainer.lora`` the adapter (peft's format, naming the
        run's base; ``braid model merge`` folds it in), listed in ``checkpoints/index.jsonl``."""
        every = self.cfg.trainer.checkpoint_every
        if every and self.version % every == 0:
            out = self.run_dir / "checkpoints" / f"v{self.version:05d}"
            row: dict = {"version": self.version, "path": str(out)}
            # the backend's weights (gathered when sharded, converted from Megatron's layout)
            state = self.learner.weights().host_copies()
            lora = self.cfg.trainer.lora
            if lora is None:
                save_policy(self.policy, out, state)
            else:
                base = self.model_dir or self.cfg.model.path
                save_adapter(out, state, lora, base)
                row |= {"adapter": True, "base": base}
            row["time"] = time.time()  # when it was complete
            with (self.run_dir / "checkpoints" / "index.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")

    def tally(self, sample: SampleRecord, outcome: Outcome, staleness: int, acc: Accumulator) -> None:
        acc.samples += 1
        acc.tokens += sample.trained_tokens  # a multi-turn trajectory's generated tokens (not its observations)
        acc.rewards += outcome.reward
        acc.correct += int(outcome.correct)
        acc.reward_failures += int(bool(outcome.failure))
        acc.lengths.append(sample.trained_tokens)
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
            "reward_failures": acc.reward_failures,
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
            "learner_restarts": len(getattr(self.learner, "revivals", ())),  # a learner process replaced
            "t_start": t_start,
            "t_end": t_end,
            **self.publisher.transport.delta_metrics(),  # weights.delta: versions sent and taken as deltas / whole
            **(extra or {}),
        }
        if getattr(self.learner, "synthetic", False):  # EMULATED: wall seconds are modelled seconds x this
            row["emulated_time_scale"] = self.learner.time_scale
        self.timeline["generation"].append([k, acc.gen_first_start, acc.gen_last_finish])
        self.timeline["training"].extend([[k, s, e] for s, e in st.busy])
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        return row

    def write_timeline(self) -> None:
        (self.run_dir / "timeline.json").write_text(json.dumps(self.timeline) + "\n")
