"""The orchestrator's launch path, simulated: groups start as earlier ones finish.

``allocator.simulator.simulate`` dispatches a whole batch at t = 0 and lets each instance drain
its queue: the SGS router's model, where every request is placed when it arrives. Braid's rollout
orchestrator does not work that way (``services.rollout.orchestrator``): it keeps at most
``capacity`` samples in flight on an instance (``modes.instance_capacity``: the engine's
``max_inflight`` in whole groups) and starts the next groups only when a group's completion frees
room, so a group is placed when it *starts*, among the instances with room then. With a small
capacity the dispatch policy has little left to choose (the instance that just freed room is
usually the only one with any); what still matters is the order groups start in (the LPT launch
order, ``GroupEstimates.launch_order``) and how the instances share the machine.

``simulate_launched`` replays one batch of groups (one step in sync mode: all of them ready at
t = 0, instances empty) through the same objects the live orchestrator uses:

- the launch order: ``AdmissionQueue("lpt")`` over the groups' estimates when a dispatcher and
  LPT admission are configured (the orchestrator's rule), else the task's order;
- each routing round: ``Fleet.acquire`` (``routing.pick_instance``) books each next group on the
  least-loaded instance with room, then the live ``GroupDispatcher.plan_round`` (the configured
  policy, its recent-length window and estimate errors, which persist across calls as in a run)
  moves groups among instances with room; each group's samples and estimated work are booked on
  the instances' table (``fleet.Fleet``, a pure table of the simulator's own) and released as they
  finish;
- each instance: ``SteppedInstance`` (the continuous-batching model of ``run_instance``), admitting
  its samples in its admission order with their group's estimate;
- the instances share ``cores`` cores by processor sharing (k busy instances each run at
  min(1, cores / k)); None: each has its own core.

Pure: no I/O, no clock. Returns when the last group finished and where each group ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from services.generation.scheduling import InstanceSpec, Job, Order
from services.generation.scheduling.admission import AdmissionQueue
from services.generation.scheduling.instance_model import SteppedInstance
from services.rollout.dispatching import GroupDispatcher, NewGroup
from services.rollout.fleet import Fleet, Reservation, fleet_of


@dataclass(frozen=True)
class SimGroup:
    """One prompt's group: ``lengths`` = the tokens each sample really generates; ``estimate`` =
    what the scheduler is told (None = unknown)."""

    key: str
    prompt_tokens: int
    lengths: tuple[int, ...]
    estimate: float | None = None


@dataclass
class LaunchResult:
    makespan_s: float
    instance_of: dict[str, int] = field(default_factory=dict)  # group -> instance it ran on
    finish_s: dict[str, float] = field(default_factory=dict)  # group -> when its last sample finished
    launch_order: list[str] = field(default_factory=list)
    work_s: list[float] = field(default_factory=list)  # each instance's compute seconds


class _Launcher:
    """The orchestrator's side: the groups not yet started, and the instances' table (``fleet.Fleet``:
    samples in flight and estimated work, booked per group and released per sample, as in a run)."""

    def __init__(self, groups: Sequence[SimGroup], fleet: Fleet, dispatcher: GroupDispatcher | None,
                 admission: Order) -> None:
        self.by_key = {g.key: g for g in groups}
        if len(self.by_key) != len(groups):
            raise ValueError("simulate_launched: group keys must be unique")
        queue: AdmissionQueue[SimGroup] = AdmissionQueue(
            "lpt" if dispatcher is not None and admission == "lpt" else "fcfs", lambda g: g.estimate)
        queue.extend(list(groups))
        self.waiting = list(queue)
        self.fleet, self.dispatcher = fleet, dispatcher
        self.booked: dict[str, Reservation] = {}  # group -> its samples on its instance
        self.left: dict[str, int] = {}  # group -> samples not finished
        self.result = LaunchResult(0.0, launch_order=[g.key for g in self.waiting])

    def route(self) -> dict[int, list[SimGroup]]:
        """One routing round (the orchestrator's ``_route``): the groups that start now, by instance."""
        batch: list[tuple[SimGroup, Reservation]] = []
        while self.waiting:
            g = self.waiting[0]
            inst = self.fleet.acquire(None, lambda _v: True, need=len(g.lengths), count=False)
            if inst is None:
                break
            self.waiting.pop(0)
            batch.append((g, inst))
        for _, inst in batch:  # placement may move it; the launch books it where it goes
            self.fleet.release(inst)
        targets: dict[str, int] = {}
        if self.dispatcher is not None and batch:
            new = [NewGroup(g.key, g.prompt_tokens, g.estimate, len(g.lengths)) for g, _ in batch]
            targets = self.dispatcher.plan_round(new, [inst for _, inst in batch], [None] * len(batch),
                                                 self.fleet.views(), self.fleet.capacity)
        out: dict[int, list[SimGroup]] = {}
        for g, inst in batch:
            i = targets.get(g.key, inst.index)
            out.setdefault(i, []).append(g)
            work = (g.estimate or 0.0) if self.dispatcher is not None else 0.0
            self.booked[g.key] = self.fleet.reserve(i, len(g.lengths), over=True, count=True, work=work)
            self.left[g.key] = len(g.lengths)
            self.result.instance_of[g.key] = i
        return out

    def finished(self, instance: int, seq_id: str, t: float) -> None:
        key, _, j = seq_id.rpartition("/")
        g = self.by_key[key]
        if self.dispatcher is not None:
            self.dispatcher.finished(g.estimate, g.lengths[int(j)])
        self.fleet.release(self.booked[key], 1)
        self.left[key] -= 1
        if self.left[key] == 0:
            self.result.finish_s[key] = t


def _jobs(g: SimGroup) -> list[Job]:
    return [Job(f"{g.key}/{j}", g.prompt_tokens, n, g.estimate) for j, n in enumerate(g.lengths)]


def simulate_launched(groups: Sequence[SimGroup], spec: InstanceSpec, n_instances: int, *, capacity: int,
                      admission: Order, dispatcher: GroupDispatcher | None = None,
                      cores: float | None = None, fleet: Fleet | None = None) -> LaunchResult:
    """Run ``groups`` (all ready at t = 0) through the launch path on ``n_instances`` instances of
    ``spec`` holding at most ``capacity`` samples each; ``dispatcher``: the live dispatcher (None:
    the orchestrator's least-loaded pick alone). A ``least_tokens`` dispatcher's probe is pointed
    at the simulated instances for the call. ``fleet``: the instances' table (None: a table of its
    own, ``n_instances`` empty rows at version 0 with room for ``capacity`` samples each)."""
    if n_instances < 1:
        raise ValueError(f"n_instances must be >= 1, got {n_instances}")
    if not groups:
        raise ValueError("simulate_launched needs at least one group")
    if any(len(g.lengths) > capacity for g in groups):
        raise ValueError(f"a group larger than the capacity ({capacity} samples) can never start")
    if cores is not None and cores <= 0:
        raise ValueError(f"cores must be > 0, got {cores}")
    if fleet is None:
        fleet = fleet_of([f"sim-{i}" for i in range(n_instances)], capacity)
    elif len(fleet) != n_instances or fleet.capacity != capacity:
        raise ValueError(f"the fleet has {len(fleet)} rows of capacity {fleet.capacity}, "
                         f"not {n_instances} of {capacity}")
    insts = [SteppedInstance(spec, admission) for _ in range(n_instances)]
    launcher = _Launcher(groups, fleet, dispatcher, admission)
    saved = dispatcher.probe if dispatcher is not None else None
    if dispatcher is not None:
        dispatcher.probe = lambda i: (insts[i].kv_tokens / spec.kv_capacity_tokens, insts[i].queued)
    try:
        _run(insts, launcher, cores)
    finally:
        if dispatcher is not None:
            dispatcher.probe = saved
    res = launcher.result
    res.makespan_s = max(res.finish_s.values())
    res.work_s = [inst.work_s for inst in insts]
    return res


def _run(insts: list[SteppedInstance], launcher: _Launcher, cores: float | None) -> None:
    """The event loop: each busy instance works through its current segment at its share of the
    cores; the segment that ends first delivers its finishes, then the orchestrator routes."""
    busy: dict[int, list] = {}  # instance -> [work left in its segment, the sequences it finishes]
    t = 0.0

    def start(i: int) -> None:
        seg = insts[i].next_segment()
        if seg is not None:
            busy[i] = [seg[0], seg[1]]

    def launch() -> None:  # a routing round, then every idle instance with work starts a segment
        for i, gs in launcher.route().items():
            insts[i].push([j for g in gs for j in _jobs(g)])
        for i in range(len(insts)):
            if i not in busy:
                start(i)

    launch()
    while busy:
        rate = 1.0 if cores is None else min(1.0, cores / len(busy))
        i = min(busy, key=lambda k: (busy[k][0], k))
        dt = busy[i][0]
        t += dt / rate
        for k in busy:
            busy[k][0] -= dt
        _, done = busy.pop(i)
        for seq_id in done:
            launcher.finished(i, seq_id, t)
        launch()
    if launcher.waiting:
        raise RuntimeError(f"{len(launcher.waiting)} groups never started")  # cannot happen: capacity checked above
