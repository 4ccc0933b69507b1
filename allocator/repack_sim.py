"""Discrete-event model of ``bounded``-mode generation on N instances, with and without repack.

The live bounded runner (``services.rollout.orchestrator``) observes SGS instances, asks pure
policies, acts. This model replaces the instances and the learner with simulated ones and
asks **the same policy objects**: ``StalenessManager`` (reserve / occupy / consume),
``routing.pick_instance`` and ``routing.instances_to_sync`` (``pull_on_completion``, as the
runner), and ``RepackCoordinator`` (ramp-down + ``best_fit``) with the simulated
clock injected. No I/O, no wall clock; a run is a function of its inputs.

What is modelled (``docs/coordination.md``, section "Simulator"):

- **Instances share one CPU core** (the benchmark pins every SGS instance to CPU 0): each
  busy instance runs decode steps whose CPU cost is ``StepCost.step(n, kv)`` (plus
  ``StepCost.prefill`` for what it admits, a re-prefill of prompt + tokens so far for a
  resumed trajectory) times ``cpu_scale``; busy instances share the core equally (processor
  sharing), so the per-step constant of each busy instance is what extra instances cost.
- **SGS core**: a staged version pauses admission and installs once nothing runs
  (``install_s``); queued samples start when their ``min_weight_version`` is installed.
- **Coordinator thread** (the trainer process, its own core): one loop does sync, repack,
  route, collect, and the learner's work; a backward of ``micro_batch_groups`` occupied head
  groups and the optimizer step block it (``TrainCost``), so samples wait to be collected and
  migrations wait to be resumed meanwhile (the source of the measured repack overhead).
- **Migration**: ``Migrate(s, d)`` interrupts every sample of the source's open calls (running
  ones keep their tokens, queued ones come back empty), each returns after ``rpc_s`` and
  resumes on ``d`` (or where routing says when ``d`` is gone or behind) at the next pass;
  in transit it counts in ``d``'s load and keeps both out of the next plan.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from services.generation.scheduling.cost import StepCost
from services.rollout.modes import instance_capacity
from services.rollout.repack_policy import InstanceSnapshot, Migrate, RepackCoordinator, RepackSettings
from services.rollout.routing import InstanceView, instances_to_sync, pick_instance, pull_on_completion
from services.rollout.staleness import StalenessManager
from services.tasks.arith import ProblemSampler, demonstration

MAX_SIM_S = 1e5  # a run that has not finished by then is stuck (a bug, not a slow fleet)
TrainCost = Callable[[Sequence[int]], float]  # seconds to backward sequences of these (prompt + response) lengths


@dataclass(frozen=True)
class GroupSpec:
    """One GRPO group: its prompt length and the true output length of each sample."""

    key: str
    prompt_tokens: int
    lengths: tuple[int, ...]


def arith_workload(seed: int, groups: int, group_size: int, max_new: int, runaway: float = 0.0,
                   sample_seed: int = 0, **dist: int | float) -> list[GroupSpec]:
    """The default task's groups (problems from ``seed``, as ``task.seed``): each sample's length
    is its scratchpad (one token per character) + EOS, capped at ``max_new``; with probability
    ``runaway`` (drawn from ``sample_seed``, as ``generation.seed``) a sample runs to the cap
    instead (a policy that does not stop: the calibrated share of capped outputs)."""
    sampler = ProblemSampler(seed, **dist)  # type: ignore[arg-type]
    rng = random.Random(f"runaway-{sample_seed}")
    out = []
    for p in sampler.batch(groups):
        base = min(max_new, len(demonstration(p)) + 1)
        lengths = tuple(max_new if rng.random() < runaway else base for _ in range(group_size))
        out.append(GroupSpec(p.prompt_id, len(p.prompt), lengths))
    return out


@dataclass(frozen=True)
class SimConfig:
    """The benchmark's settings (``bench/coordination.py`` over ``deploy/configs/default.yaml``)."""

    instances: int
    repack: bool
    iterations: int = 30
    eta: int = 2
    prompts_per_iteration: int = 32
    group_size: int = 8
    max_inflight_groups: int = 0  # per instance (0 = the engine's admission in whole groups), as the orchestrator's
    micro_batch_groups: int = 8
    max_new_tokens: int = 192
    engine_max_seqs: int = 256  # generation.max_inflight
    kv_blocks: int = 512
    page_size: int = 32
    settings: RepackSettings = field(default_factory=lambda: RepackSettings(interval_s=0.5))
    cpu_scale: float = 1.0  # wall CPU seconds of the SGS per modelled engine second (calibrated)
    install_s: float = 0.015  # weight install (engine bench: vLLM load_weights)
    rpc_s: float = 0.005  # a sample's hop from the SGS core to the coordinator
    optimizer_s: float = 0.0  # optimizer step + snapshot after the last backward

    @property
    def capacity(self) -> int:
        """Samples in flight per instance: the orchestrator's rule (``modes.instance_capacity``)."""
        return instance_capacity(self.group_size, self.max_inflight_groups, self.engine_max_seqs)


@dataclass
class _Seq:
    key: str
    group: str
    prompt: int
    length: int  # true output length
    v_traj: int
    done: int = 0  # tokens generated before this segment
    first_version: int = -1
    step0: int = 0  # instance step counter at admission
    admitted: bool = False


@dataclass
class _Inst:
    index: int
    version: int = 0
    offered: int = 0
    pending: int = -1  # staged version (-1: none)
    waiting: deque = field(default_factory=deque)
    running: dict = field(default_factory=dict)  # key -> _Seq
    finish: list = field(default_factory=list)  # heap (finish step, key)
    steps: int = 0
    held: int = 0  # KV tokens of the running sequences
    busy: float = 0.0  # CPU seconds left in the step in progress
    new_tokens: int = 0  # tokens the step in progress adds


@dataclass
class SimResult:
    iteration_end: list[float]
    iteration_tokens: list[int]
    iteration_samples: list[int]
    kv_means: list[float]
    overheads: list[float]
    migrations: int
    repacks: int
    syncs: int
    violations: int
    consumed: list[list[str]] = field(default_factory=list)  # group keys trained per iteration
    moves: list[tuple[Migrate, InstanceSnapshot, InstanceSnapshot, list[str]]] = field(default_factory=list)
    resumed_on: dict[str, int] = field(default_factory=dict)  # migrated sample -> where it resumed (last move)
    decoded_tokens: int = 0  # tokens produced by decode steps
    finished_tokens: int = 0  # output tokens of the samples that finished
    left_tokens: int = 0  # tokens generated so far by samples unfinished at the end

    def steady(self) -> tuple[float, float]:
        """(tokens/s, samples/s) over iterations 1.. (the benchmark's ``steady_throughput``)."""
        wall = self.iteration_end[-1] - self.iteration_end[0]
        return sum(self.iteration_tokens[1:]) / wall, sum(self.iteration_samples[1:]) / wall


class _Sim:
    def __init__(self, cfg: SimConfig, groups: Sequence[GroupSpec], cost: StepCost, train: TrainCost) -> None:
        self.cfg, self.cost, self.train = cfg, cost, train
        self.t = 0.0
        self.groups = deque(groups)
        self.insts = [_Inst(i) for i in range(cfg.instances)]
        batch = cfg.prompts_per_iteration * cfg.group_size
        self.mgr = StalenessManager(cfg.eta, batch, cfg.group_size)
        self.coord = RepackCoordinator(cfg.settings, clock=lambda: self.t)
        self.capacity = cfg.capacity
        self.latest = 0
        self.busy_until = 0.0  # the coordinator thread is blocked (backward, optimizer step) until then
        self.inbox: list[tuple[float, _Seq, bool]] = []  # (arrival, seq, interrupted)
        self.resume: list[_Seq] = []
        self.moving: dict[str, tuple[int, int, float]] = {}  # key -> (source, destination, issued)
        self.open: dict[str, list[_Seq | None]] = {}  # group -> finished samples (None = not yet)
        self.on: dict[str, int] = {}  # seq key -> instance it is queued or running on
        self.v_traj: dict[str, int] = {}
        self.trained: set[str] = set()
        self.stepped = False
        self.pending_step: float | None = None  # an optimizer step in progress: the new version exists at its end
        self.next_tick = 0.0
        self.dirty = True  # something the loop reacts to happened since its last pass
        self.out = SimResult([], [], [], [], [], 0, 0, 0, 0)

    # ------------------------------------------------------------------ instances (mechanism)
    def _inflight(self, i: int) -> int:
        inst = self.insts[i]
        return len(inst.running) + len(inst.waiting)

    def _start_step(self, inst: _Inst) -> None:
        """Install a staged version once nothing runs, admit eligible queued samples, price the step."""
        work = 0.0
        if inst.pending >= 0 and not inst.running:
            inst.version, inst.pending = inst.pending, -1
            work += self.cfg.install_s
        prefill, admitted = 0, 0
        if inst.pending < 0:
            kept: deque = deque()
            while inst.waiting:
                s = inst.waiting.popleft()
                if s.v_traj > inst.version or len(inst.running) >= self.cfg.engine_max_seqs:
                    kept.append(s)
                    continue
                s.admitted, s.step0 = True, inst.steps
                s.first_version = inst.version if s.first_version < 0 else s.first_version
                inst.running[s.key] = s
                heapq.heappush(inst.finish, (inst.steps + s.length - s.done, s.key))
                inst.held += s.prompt + s.done
                prefill, admitted = prefill + s.prompt + s.done, admitted + 1
            inst.waiting = kept
        n = len(inst.running)
        work += self.cost.prefill(prefill, admitted) + self.cost.step(n, inst.held)
        inst.busy, inst.new_tokens = work * self.cfg.cpu_scale, n

    def _end_step(self, inst: _Inst) -> None:
        """A decode step ended: every running sample has one more token; finished ones return."""
        inst.busy = 0.0
        if not inst.new_tokens:
            return
        self.out.decoded_tokens += len(inst.running)
        inst.steps += 1
        inst.held += len(inst.running)
        while inst.finish and inst.finish[0][0] <= inst.steps:
            _, key = heapq.heappop(inst.finish)
            s = inst.running.pop(key, None)
            if s is not None:
                inst.held -= s.prompt + s.length
                self.out.finished_tokens += s.length
                self.inbox.append((self.t + self.cfg.rpc_s, s, False))
                self.dirty = True

    def _interrupt(self, i: int) -> list[_Seq]:
        """Every sample on instance ``i`` comes back with its tokens so far (queued ones with none)."""
        inst = self.insts[i]
        out = list(inst.waiting)
        inst.waiting = deque()
        for s in inst.running.values():
            s.done += inst.steps - s.step0
            inst.held -= s.prompt + s.done
            out.append(s)
        inst.running, inst.finish = {}, []
        for s in out:
            s.admitted = False
            self.inbox.append((self.t + self.cfg.rpc_s, s, True))
        return out

    def snapshot(self) -> list[InstanceSnapshot]:
        """Each instance's Health: KV blocks in use (vLLM's fraction), running, queued, versions."""
        transit: dict[int, int] = {}
        for src, dst, _ in self.moving.values():
            transit[src] = transit.get(src, 0) + 1
            transit[dst] = transit.get(dst, 0) + 1
        snaps = []
        for inst in self.insts:
            blocks = sum(math.ceil((s.prompt + s.done + inst.steps - s.step0) / self.cfg.page_size)
                         for s in inst.running.values())
            snaps.append(InstanceSnapshot(inst.index, inst.version, blocks / self.cfg.kv_blocks, len(inst.running),
                                          len(inst.waiting), True, transit.get(inst.index, 0), inst.pending >= 0))
        self.out.kv_means.append(sum(s.kv_used for s in snaps) / len(snaps))
        return snaps

    # ------------------------------------------------------------------ the coordinator loop (policy calls)
    def _views(self) -> list[InstanceView]:
        incoming = [0] * len(self.insts)
        for _, dst, _ in self.moving.values():
            incoming[dst] += 1
        return [InstanceView(i.index, i.offered, self._inflight(i.index) + incoming[i.index], self.capacity)
                for i in self.insts]

    def _sync(self) -> None:
        idle_only = pull_on_completion(partial_rollout=False)  # the model has no partial rollout
        for i in instances_to_sync(self._views(), self.latest, self.mgr.can_reserve, idle_only):
            inst = self.insts[i]
            inst.offered = inst.pending = self.latest
            self.out.syncs += 1

    def _repack(self) -> None:
        if not self.coord.due(force=self.stepped):
            return
        self.stepped = False
        snaps = self.snapshot()
        plan = self.coord.plan(snaps)
        if not self.cfg.repack:
            return
        for m in plan:
            moved = self._interrupt(m.source)
            self.out.moves.append((m, snaps[m.source], snaps[m.destination], [s.key for s in moved]))
            for s in moved:
                self.moving[s.key] = (m.source, m.destination, self.t)
            self.out.repacks += 1 if moved else 0

    def _route(self) -> None:
        waiting = []
        for s in sorted(self.resume, key=lambda s: s.v_traj):
            views = self._views()
            dst = self.moving.get(s.key, (0, -1, 0.0))[1]
            inst = views[dst] if dst >= 0 and views[dst].version >= s.v_traj else \
                pick_instance(s.v_traj, views, self.mgr.can_reserve)
            if inst is None:
                waiting.append(s)
                continue
            move = self.moving.pop(s.key, None)
            if move is not None:
                self.out.overheads.append(self.t - move[2])
                self.out.migrations += 1
                self.out.resumed_on[s.key] = inst.index
            self._queue(s, inst.index)
        self.resume = waiting
        while self.groups and (inst := pick_instance(None, self._views(), self.mgr.can_reserve,
                                                     need=self.cfg.group_size)) is not None:
            g = self.groups.popleft()
            self.mgr.reserve(g.key, inst.version)
            self.open[g.key] = [None] * len(g.lengths)
            for j, n in enumerate(g.lengths):
                self._queue(_Seq(f"{g.key}/{j}", g.key, g.prompt_tokens, n, inst.version), inst.index)

    def _queue(self, s: _Seq, i: int) -> None:
        self.on[s.key] = i
        self.insts[i].waiting.append(s)

    def _collect(self) -> None:
        arrived = [x for x in self.inbox if x[0] <= self.t]
        self.inbox = [x for x in self.inbox if x[0] > self.t]
        for _, s, interrupted in arrived:
            if interrupted:
                self.resume.append(s)
                continue
            self.on.pop(s.key, None)
            done = self.open[s.group]
            done[int(s.key.rsplit("/", 1)[1])] = s
            if all(x is not None for x in done):
                self.mgr.occupy(s.group, generated_version=min(x.first_version for x in done if x is not None))

    def _train_head(self) -> bool:
        """Backward new occupied head groups by micro-batch (blocks the loop); True if it did."""
        new = [e.key for e in self.mgr.head_occupied() if e.key not in self.trained]
        room = self.mgr.batch - len(self.trained)
        new = new[: max(room, 0)]
        if new and (len(new) >= self.cfg.micro_batch_groups or len(new) == room):
            self.busy_until = self.t + self.train(self._seq_lengths(new))
            self.trained.update(new)
            self.dirty = True
            return True
        return False

    def _seq_lengths(self, keys: Sequence[str]) -> list[int]:
        return [s.prompt + s.length for k in keys for s in self.open[k] if s is not None]

    def _consume(self) -> None:
        result = self.mgr.consume(select=lambda occ, n: sorted(occ, key=lambda e: e.key not in self.trained)[:n])
        keys = [e.key for e in result.entries]
        untrained = [k for k in keys if k not in self.trained]
        self.busy_until = (self.t + (self.train(self._seq_lengths(untrained)) if untrained else 0.0)
                           + self.cfg.optimizer_s)
        self.out.violations += sum(1 for e in result.entries if e.version + self.cfg.eta < e.buffer_version)
        self.out.iteration_tokens.append(sum(s.length for k in keys for s in self.open[k] if s is not None))
        self.out.iteration_samples.append(sum(len(self.open[k]) for k in keys))
        self.out.consumed.append(keys)
        for k in keys:
            del self.open[k]
        self.trained.clear()
        self.pending_step = self.busy_until
        self.dirty = True

    def _pass(self) -> None:
        """One pass of the runner's loop: sync, repack, route, collect, train; consume when Ready."""
        if self.t < self.busy_until or not (self.dirty or self.coord.due(force=self.stepped)
                                            or any(x[0] <= self.t for x in self.inbox)):
            return
        self.dirty = False
        if self.pending_step is not None:
            self.latest, self.pending_step, self.stepped = self.latest + 1, None, True
            self.out.iteration_end.append(self.t)
        self._sync()
        self._repack()
        self._route()
        self._collect()
        if not self._train_head() and self.mgr.ready():
            self._consume()

    # ------------------------------------------------------------------ the event loop
    def run(self) -> SimResult:
        while len(self.out.iteration_end) < self.cfg.iterations:
            if self.t > MAX_SIM_S:
                raise RuntimeError(f"no progress by t={self.t:.0f} s (iteration {len(self.out.iteration_end)})")
            self._pass()
            for inst in self.insts:
                if inst.busy <= 0.0 and (inst.running or inst.waiting or inst.pending >= 0):
                    self._start_step(inst)
                    if inst.busy <= 0.0:  # nothing admissible yet
                        inst.busy = 0.0
            self._advance()
        self.out.left_tokens = self._progress()
        return self.out

    def _progress(self) -> int:
        """Tokens generated so far by every sample that has not finished (wherever it is)."""
        left = sum(s.done + inst.steps - s.step0 for inst in self.insts for s in inst.running.values())
        left += sum(s.done for inst in self.insts for s in inst.waiting)
        left += sum(s.done for s in self.resume) + sum(s.done for _, s, interrupted in self.inbox if interrupted)
        return left

    def _advance(self) -> None:
        """Move the clock to the next event: a step's end (processor sharing) or a timer."""
        active = [i for i in self.insts if i.busy > 0.0]
        timers = [x[0] for x in self.inbox if x[0] > self.t]
        if self.busy_until > self.t:
            timers.append(self.busy_until)
        while self.next_tick <= self.t:
            self.next_tick += self.cfg.settings.interval_s
        timers.append(self.next_tick)
        dt = min(timers) - self.t
        if active:
            dt = min(dt, min(i.busy for i in active) * len(active))
        self.t += max(dt, 0.0)
        for inst in active:
            inst.busy -= dt / len(active)
            if inst.busy <= 1e-12:
                self._end_step(inst)


def simulate(cfg: SimConfig, groups: Sequence[GroupSpec], cost: StepCost, train: TrainCost) -> SimResult:
    """Run ``cfg.iterations`` optimizer steps of bounded mode over ``groups`` (enough of them)."""
    need = (cfg.iterations + cfg.eta + 1) * cfg.prompts_per_iteration + cfg.instances * cfg.capacity // cfg.group_size
    if len(groups) < need:
        raise ValueError(f"{cfg.iterations} iterations may start up to {need} groups; {len(groups)} given")
    return _Sim(cfg, groups, cost, train).run()


def repack_ratio(cfg: SimConfig, seeds: Sequence[int], cost: StepCost, train: TrainCost,
                 workload: Callable[[int], list[GroupSpec]]) -> dict:
    """Both variants per seed (same groups); the median per-seed ratio of trained tokens/s."""
    rows = []
    for seed in seeds:
        groups = workload(seed)
        none = simulate(_variant(cfg, False), groups, cost, train)
        rep = simulate(_variant(cfg, True), groups, cost, train)
        rows.append({"seed": seed, "none": none.steady(), "repack": rep.steady(),
                     "migrations": rep.migrations,
                     "overhead_mean": statistics.mean(rep.overheads) if rep.overheads else None,
                     "kv": (statistics.mean(none.kv_means), statistics.mean(rep.kv_means)),
                     "violations": none.violations + rep.violations})
    ratios = [r["repack"][0] / r["none"][0] for r in rows]
    return {"ratio": statistics.median(ratios), "ratios": ratios, "runs": rows}


def _variant(cfg: SimConfig, repack: bool) -> SimConfig:
    return replace(cfg, repack=repack)


__all__ = ["GroupSpec", "SimConfig", "SimResult", "TrainCost", "arith_workload", "repack_ratio", "simulate"]
