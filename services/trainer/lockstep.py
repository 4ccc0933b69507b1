"""The lock-step runner: ``sequential``, ``sync`` and ``one_step`` pipeline modes.

- ``sequential`` — the naive baseline: generate the whole batch, then train on it.
- ``sync`` — on-policy. Each iteration's prompts are generated with the current weights
  (``min_weight_version``), and the trainer runs forward/backward on complete groups as they
  stream in, so training overlaps the generation tail (StreamRL's dynamic-batch pipelining).
  One optimizer step per iteration: micro-batches accumulate gradients.
- ``one_step`` — generation of iteration k+1 is requested before training on iteration k
  starts, with the weights the trainer had then, so the stages overlap fully and every sample
  is at most one version stale (StreamRL's one-step asynchronous pipelining). The clipped
  importance ratio uses the behaviour log-probs the SGS reported.
"""

from __future__ import annotations

import time
from concurrent.futures import Future

from services.common.types import GenerateParams, SampleRecord
from services.trainer.batching import DynamicBatcher
from services.trainer.learner import Group
from services.trainer.rewards import Outcome
from services.trainer.runtime import Accumulator, TrainerRuntime
from services.trainer.streams import SampleStream


class LockstepRunner:
    """One Generate request per iteration, trained on as its groups complete."""

    def __init__(self, rt: TrainerRuntime) -> None:
        self.rt = rt
        self.mode = rt.cfg.trainer.mode
        self._rewards: dict[tuple[str, int], Future[Outcome]] = {}  # scored on arrival, awaited when the group completes
        self._cursors: dict[int, tuple] = {}  # iteration -> the sampler's state before its batch was drawn

    def run(self, iterations: int, progress=None) -> None:
        """Iterations ``version .. iterations - 1`` (a resumed runtime starts at its checkpoint's)."""
        first = self.rt.version
        streams = {first: self.request(first, self.rt.version)} if first < iterations else {}
        for k in range(first, iterations):
            if self.mode == "one_step" and k + 1 < iterations:
                streams[k + 1] = self.request(k + 1, self.rt.version)
            row = self.train_on(streams.pop(k), k)
            self.rt.maybe_save_recovery(lambda: {"sampler": self._cursors.get(k + 1, self.rt.sampler.state())})
            self._cursors.pop(k, None)
            if self.mode != "one_step" and k + 1 < iterations:
                streams[k + 1] = self.request(k + 1, self.rt.version)
            if progress is not None:
                progress(k, row)
        self.rt.publisher.wait(self.rt.version)

    def request(self, iteration: int, min_version: int) -> SampleStream:
        rt = self.rt
        self._cursors[iteration] = rt.sampler.state()  # the data cursor of a checkpoint taken before it is trained
        problems = rt.sampler.batch(rt.cfg.trainer.prompts_per_iteration)
        params = GenerateParams(rt.cfg.trainer.group_size, 0, min_version, tag=f"iter-{iteration}")
        forced = rt.cfg.forced_length_ramp.length(iteration)  # 0 unless a length ramp is configured (bench/scaleout.py)
        return SampleStream(rt.clients, rt.prompt_specs(problems, forced), params)

    def train_on(self, stream: SampleStream, iteration: int) -> dict:
        tc = self.rt.cfg.trainer
        learner = self.rt.learner
        t_start = time.time()
        acc = Accumulator()
        stats = learner.begin()
        batcher = DynamicBatcher(tc.group_size, tc.micro_batch_groups)
        source = list(stream) if self.mode == "sequential" else stream
        consumed: list[Group] = []
        for sample in source:
            self._observe(sample)
            groups = batcher.add(sample)
            if groups:
                consumed += [self._rewarded(g, acc) for g in groups]
                learner.backward(consumed[-len(groups):])
        groups = batcher.flush()
        if groups:
            consumed += [self._rewarded(g, acc) for g in groups]
            learner.backward(consumed[-len(groups):])
        if batcher.incomplete:
            raise RuntimeError(f"iteration {iteration}: {batcher.incomplete} groups incomplete at end of stream")
        out = self.rt.step_and_snapshot(stats, offer=True, consumed=consumed)
        return self.rt.record(iteration, t_start, time.time(), acc, stats, out.grad_norm, out.stall_s)

    def _rewarded(self, samples: list[SampleRecord], acc: Accumulator) -> Group:
        """The complete group with its rewards (waiting for the last scores), tallied."""
        outcomes = [self._rewards.pop((s.prompt_id, s.sample_index)).result() for s in samples]
        for s, o in zip(samples, outcomes):
            self.rt.tally(s, o, self.rt.version - s.weight_version, acc)
        return Group(samples, [o.reward for o in outcomes], [o.correct for o in outcomes])

    def _observe(self, sample: SampleRecord) -> None:
        self._rewards[(sample.prompt_id, sample.sample_index)] = self.rt.score(sample)
