"""Trainer backend ``emulated``: the learner's interface with no model compute (EMULATED).

An emulated run's tokens are SYNTHETIC (``generation.engine: emulated``), so nothing can be
learned from them; what an emulated learner must get right is *time*. ``EmulatedLearner`` takes the
learner's calls as the real one does (``begin``, ``backward`` per batch of complete groups,
``step``, ``state``/``load_state``, ``weights``) and waits out what the allocator's training model
predicts for them (``TrainTimeModel``), on the monotonic clock, without using the CPU:

- ``backward(groups)``: the compute of the micro-batches the real learner would make of these
  sequences (``allocator.padding.micro_batch_work``: length-bucketed, right-padded), priced by
  ``allocator.training.step_time`` on the declared GPUs and parallel configuration: compute
  (measured profile or roofline), tensor-parallel all-reduces, the pipeline bubble and its
  point-to-point transfers, for this call's tokens;
- ``step()``: the per-step terms, the profile's fixed time (optimizer step, launches) and the
  data-parallel gradient exchange.

Every duration is multiplied by ``generation.emulation.time_scale``. The weights never change: each
version carries the run's own checkpoint (the relays and pushers move its real bytes); the
declared model's size on the wire is modelled by the SGS's reload time
(``generation.emulation.reload_s``, which ``braid run --cluster`` sets from the cluster's link).
``modelled`` lists each step's predicted seconds (unscaled) for the run's record.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from services.common.emulation_config import TrainerEmulationConfig
from services.common.weights import TensorSpec, WeightStream, dtype_name
from services.trainer.algorithms import ObjectiveParams, get_algorithm
from services.trainer.learner import Group, StepStats, group_fate

if TYPE_CHECKING:
    from allocator.memory import ParallelConfig
    from allocator.training import TrainSite
    from services.common.config import RunConfig
    from services.generation.scheduling.models import ModelSpec
    from services.policy.model import Policy

CPU_LOCAL = "cpu-local"  # this machine's cores as "GPUs" (deploy/clusters/local-cpu.yaml's values)
_CPU_LOCAL_SITE = {"tflops": 0.02, "memory_gb": 4.0, "memory_tb_s": 0.02, "cost_per_gpu": 1.0}
PROMPT_TOKENS_GUESS = 64  # planning ``parallel: auto``: prompt tokens per sequence


@dataclass(frozen=True)
class TrainTimeModel:
    """Predicted seconds of the learner's work (pure): the allocator's training model on one
    declared site, model and parallel configuration."""

    model: ModelSpec
    site: TrainSite
    parallel: ParallelConfig
    algorithm: str
    micro_batch_tokens: int
    source: str  # where the compute term comes from (a measured profile or the roofline)

    def backward_s(self, lengths: list[int]) -> float:
        """One ``backward`` call over sequences of these lengths (prompt + response tokens)."""
        if not lengths:
            return 0.0
        from allocator.padding import micro_batch_work
        from allocator.training import TrainWorkload, step_time

        work = micro_batch_work([lengths], self.micro_batch_tokens)
        st = step_time(self.model, self.parallel, self.site, TrainWorkload.from_work(work, self.algorithm))
        return st.compute_s + st.tp_comm_s + st.pp_bubble_s + st.pp_p2p_s

    def step_s(self) -> float:
        """The optimizer step's own terms: the profile's fixed time and the gradient exchange."""
        from allocator.training import TrainWorkload, step_time

        st = step_time(self.model, self.parallel, self.site, TrainWorkload(1.0, 1.0, 1, self.algorithm))
        return st.fixed_s + st.dp_comm_s

    def describe(self) -> dict:
        return {"model": self.model.name, "gpu": self.site.hw.name, "parallel": self.parallel.label(),
                "gpus": self.parallel.gpus, "algorithm": self.algorithm, "source": self.source}


def declared_model(emu: TrainerEmulationConfig, model_dir: str) -> ModelSpec:
    """The model whose work is modelled: a named one, else the checkpoint's own (``config.json``),
    named after the shipped spec with the same architecture when there is one."""
    from services.generation.scheduling.models import MODELS, get_model, spec_from_hf_config

    if emu.model is not None:
        return get_model(emu.model)
    config = json.loads((Path(model_dir) / "config.json").read_text())
    spec = spec_from_hf_config(Path(model_dir).name, config)
    for known in MODELS.values():
        if known.fingerprint() | {"name": ""} == spec.fingerprint() | {"name": ""}:
            return known
    return spec


def build_time_model(cfg: RunConfig, model_dir: str) -> TrainTimeModel:
    """The time model ``trainer.emulation`` declares (``ValueError`` naming what does not fit)."""
    from allocator.allocate import AllocationInputError, resolve_train_profile, site_hardware, train_source
    from allocator.cluster import SiteSpec
    from allocator.training import TrainSite

    emu = cfg.trainer.emulation or TrainerEmulationConfig()
    model = declared_model(emu, model_dir)
    custom = _CPU_LOCAL_SITE if emu.gpu == CPU_LOCAL else {}
    spec = SiteSpec(name="emulated-trainer", gpu=emu.gpu, count=emu.gpus, gpus_per_node=emu.gpus_per_node,
                    inter_node_gbps=emu.inter_node_gbps, roles=["training"], train_profile=emu.train_profile, **custom)
    algorithm = cfg.trainer.algorithm.name
    try:
        hw, _ = site_hardware(spec, "trainer.emulation")
        profile, path = resolve_train_profile(spec, model, algorithm, "trainer.emulation")
    except AllocationInputError as err:
        raise ValueError(str(err)) from None
    site = TrainSite(hw, emu.gpus_per_node, emu.inter_node_gbps / 8.0, tflops=spec.tflops, profile=profile)
    mbt = cfg.trainer.micro_batch_tokens
    parallel = _parallel(emu, model, site, cfg, mbt)
    return TrainTimeModel(model, site, parallel, algorithm, mbt, train_source(path))


def _parallel(emu: TrainerEmulationConfig, model: ModelSpec, site: TrainSite, cfg: RunConfig, mbt: int):
    """The declared parallel configuration, or the fastest one that fits an iteration of
    ``max_new_tokens``-long responses (``auto``)."""
    from allocator.memory import ParallelConfig
    from allocator.padding import micro_batch_work
    from allocator.training import TrainWorkload, search

    if emu.parallel != "auto":
        dp, tp, pp = (int(part[2:]) for part in emu.parallel.split("-"))
        if dp * tp * pp != emu.gpus:
            raise ValueError(f"trainer.emulation.parallel {emu.parallel} uses {dp * tp * pp} GPUs, "
                             f"trainer.emulation.gpus is {emu.gpus}")
        return ParallelConfig(dp, tp, pp)
    tc = cfg.trainer
    lengths = [PROMPT_TOKENS_GUESS + cfg.generation.max_new_tokens] * (tc.prompts_per_iteration * tc.group_size)
    work = TrainWorkload.from_work(micro_batch_work([lengths], mbt), tc.algorithm.name)
    found = search(model, emu.gpus, site, work)
    if found.best is None:
        raise ValueError(f"trainer.emulation: {found.why_not(model.name, site.hw.name)}")
    return found.best.cfg


@dataclass
class EmulatedStep:
    """One emulated optimizer step: its predicted seconds (unscaled) and what it trained."""

    backward_s: float = 0.0
    step_s: float = 0.0
    calls: int = 0
    sequences: int = 0
    tokens: int = 0
    waited_s: list[float] = field(default_factory=list)  # scaled waits, as slept

    def to_json(self) -> dict:
        return {"predicted_s": self.backward_s + self.step_s, "backward_s": self.backward_s, "step_s": self.step_s,
                "calls": self.calls, "sequences": self.sequences, "tokens": self.tokens}


class EmulatedLearner:
    """The learner's interface over ``TrainTimeModel`` (see the module docstring). ``sleep``: how a
    modelled duration is waited out (``time.sleep``; tests pass a recorder)."""

    synthetic = True

    def __init__(self, cfg: RunConfig, policy: Policy, model_dir: str, sleep=time.sleep) -> None:
        self.cfg = cfg
        self.policy = policy
        self.model = policy.model  # what evaluation and the final checkpoint read: the run's own, unchanged
        self.time_model = build_time_model(cfg, model_dir)
        tc = cfg.trainer
        # which groups a real learner would train: the same rule (no KL reference: kl_coef 0)
        self._algo, self._objective = tc.algorithm, get_algorithm(tc.algorithm.name)
        self._params = ObjectiveParams.from_config(tc)
        self._skip_zero = tc.skip_zero_advantage_groups and tc.kl_coef == 0
        emu = cfg.generation.emulation
        self.time_scale = emu.time_scale if emu is not None else 1.0
        self._sleep = sleep
        self.stats = StepStats()
        self.current = EmulatedStep()
        self.modelled: list[EmulatedStep] = []

    def begin(self) -> StepStats:
        self.stats = StepStats()
        self.current = EmulatedStep()
        return self.stats

    def backward(self, groups: list[Group]) -> None:
        t0 = time.time()
        lengths = [len(s.prompt_token_ids) + len(s.token_ids) for g in self._trained(groups) for s in g.samples]
        seconds = self.time_model.backward_s(lengths)
        self._wait(seconds)
        cur = self.current
        cur.backward_s += seconds
        cur.calls += 1
        cur.sequences += len(lengths)
        cur.tokens += sum(lengths)
        self.stats.trained_samples += len(lengths)
        self.stats.micro_batches += 1 if lengths else 0
        self.stats.busy.append((t0, time.time()))

    def _trained(self, groups: list[Group]) -> list[Group]:
        """The groups the real learner would compute (``group_fate``), the others counted as it counts them."""
        kept = []
        for group in groups:
            fate, _ = group_fate(group, self._algo, self._objective, self._params, self._skip_zero)
            if fate == "filtered":
                self.stats.filtered_groups += 1
            elif fate == "zero":
                self.stats.zero_adv_groups += 1
            else:
                kept.append(group)
        return kept

    def step(self) -> float:
        """Wait out the step's own terms; the gradient norm of an emulated step is 0 (nothing trains)."""
        t0 = time.time()
        seconds = self.time_model.step_s()
        self._wait(seconds)
        self.current.step_s = seconds
        self.modelled.append(self.current)
        self.stats.busy.append((t0, time.time()))
        return 0.0

    def _wait(self, modelled_s: float) -> None:
        scaled = modelled_s * self.time_scale
        self.current.waited_s.append(scaled)
        if scaled > 0:
            self._sleep(scaled)

    def state(self) -> dict:
        return {"emulated_steps": [s.to_json() for s in self.modelled]}

    def load_state(self, state: dict | None) -> None:
        steps = (state or {}).get("emulated_steps", [])
        self.modelled = [EmulatedStep(s["backward_s"], s["step_s"], s["calls"], s["sequences"], s["tokens"])
                         for s in steps]

    def weights(self) -> WeightStream:
        """The run's own checkpoint, unchanged: the weight plane moves its real bytes every version."""
        state = self.model.state_dict()
        specs = {k: TensorSpec(dtype_name(v.dtype), tuple(v.shape)) for k, v in state.items()}
        return WeightStream(specs, ((k, v.detach()) for k, v in state.items()))

    def summary(self) -> dict:
        """The run's record of modelled training time (EMULATED: predictions, never measurements)."""
        predicted = [s.backward_s + s.step_s for s in self.modelled]
        return {"label": "EMULATED", "time_model": self.time_model.describe(), "time_scale": self.time_scale,
                "steps": len(predicted), "predicted_train_s": sum(predicted),
                "predicted_step_s_mean": sum(predicted) / len(predicted) if predicted else 0.0}

    def close(self) -> None:
        pass
