"""Hardware-affinity planning: which pool of GPUs generates each task's rollouts (RollArt §3.1,
§4.1 P1, §7.3). Pure: no I/O.

RollArt observes that agentic tasks split into prefill-heavy ones (many turns, short actions:
FrozenLake, SWE-bench; the growing context is processed again every turn) and decode-heavy ones
(few turns, long reasoning: GEM-math), and that at equal cost 2 H800 beat 6 H20 on the first
(down to 0.53x rollout time) while the H20s win the second (0.49-0.79x) (§3.1, Fig. 4). This
module prices a task on a pool of GPUs with a roofline of each phase and maps tasks to pools.

**Cost of one rollout step of a task on a pool** (an instance = ``tp`` GPUs of the pool's kind,
``tp`` and the decode cost from ``scheduling.profiles.derive_profile``, the spec-sheet roofline the
allocator already uses; ``n = gpus // tp`` instances, ``m = ceil(M / n)`` trajectories each, run
turn by turn in lockstep). A trajectory's turn ``t = 1..T`` starts decoding with a context of
``S_t = P + (t-1)(A + O)`` tokens (P prompt, O observation per turn, A output per turn).

- **prefill** (compute-bound): the turn's new tokens are ``n_t = P`` (t = 1) or ``O`` with prefix
  caching (the earlier turns' KV is reused), the whole ``S_t`` without. FLOPs of ``n`` new tokens
  after ``c`` cached ones: ``n 2N + 4 L h (n c + n^2 / 2)`` (matmuls over N parameters without
  the embedding lookup; causal attention, QK^T and AV). Instance time per turn:
  ``max(m FLOPs / (tp peak PREFILL_MFU), chunks (W / BW + k4))``, the floor being one read of the
  weights per forward pass of ``PREFILL_CHUNK`` tokens.
- **decode** (bandwidth-bound): A steps of StaleFlow's per-step cost (``scheduling.cost.StepCost``,
  derived: ``k1 kv_bytes kv + max(W / BW, b 2N / (peak FLOPS_EFFICIENCY)) + k4``): weights and the
  batch's KV read once per step, batched over ``b = min(m, max_batch, KV capacity / (S_t + A))``
  sequences, ``ceil(m / b)`` waves.

A task's time on a pool is the sum over turns of both; the environment's time is left out (the
same on any GPU). Tasks that share a pool are priced one after the other (their decode steps
could share weight reads, so this overstates a shared pool: it errs towards separating tasks).

**Planner** (``plan_affinity``): every task goes to one pool (what ``generation.affinity``
expresses); the rollout step's makespan is the slowest pool's total. ``best_assignment`` finds the
mapping of least makespan (ties: least total busy time) exactly, by depth-first branch and bound:
tasks longest first, each pool tried cheapest first (pools priced alike and equally loaded
once: they are interchangeable), a branch cut when its lower bound — the largest of the current
makespan, ``min_p(load_p + t_kp)`` for every unplaced task k, and the total load spread evenly —
is not below the best found. Worst case ``pools^tasks``; inputs are capped at 12 tasks and 6
pools (the tests compare it with exhaustive search on small random cases).

Constants: spec sheets in ``scheduling.hardware`` (StreamRL/RollArt Table: H20 148 TFLOPS, 4 TB/s;
H800 989.5 TFLOPS, 3.35 TB/s); ``BW_EFFICIENCY``, ``FLOPS_EFFICIENCY``, ``STEP_OVERHEAD_S`` from
``scheduling.profiles``; ``PREFILL_MFU`` and ``PREFILL_CHUNK`` below. None is measured on a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from services.generation.scheduling.cost import StepCost
from services.generation.scheduling.hardware import get_hardware
from services.generation.scheduling.models import ModelSpec, get_model
from services.generation.scheduling.profiles import derive_profile

# Named assumption, not measured: large prefill batches run dense GEMMs, which reach roughly half of
# the BF16 peak in serving engines; the direction of the H20/H800 result holds over 0.3-0.7 (tested).
PREFILL_MFU = 0.5
PREFILL_CHUNK = 8192  # tokens per prefill forward pass (vLLM V1's max_num_batched_tokens default on GPUs)
MAX_TASKS = 12
MAX_POOLS = 6
TIE = 1e-9  # relative: makespans this close are equal (float sums in different orders)


@dataclass(frozen=True)
class TaskWorkload:
    """What one rollout step of a task generates (per trajectory unless said otherwise)."""

    name: str
    trajectories: int  # M: trajectories per rollout step
    turns: int  # T: generate + environment step cycles per trajectory
    prompt_tokens: int  # P: the first turn's prompt (system + task)
    observation_tokens: int  # O: new environment tokens appended before each later turn
    output_tokens: int  # A: tokens generated per turn (action, with any reasoning)
    prefix_cache: bool = True  # reuse the earlier turns' KV (else the whole context is prefilled each turn)

    def __post_init__(self) -> None:
        for name in ("trajectories", "turns", "prompt_tokens", "output_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"task {self.name!r}: {name} must be >= 1, got {getattr(self, name)}")
        if self.observation_tokens < 0:
            raise ValueError(f"task {self.name!r}: observation_tokens must be >= 0, got {self.observation_tokens}")

    def context(self, turn: int) -> int:
        """S_t: tokens in the KV cache when turn ``turn`` (1-based) starts decoding."""
        return self.prompt_tokens + (turn - 1) * (self.output_tokens + self.observation_tokens)

    def new_tokens(self, turn: int) -> int:
        """Tokens prefilled at turn ``turn``: P, then O with prefix caching, else the whole context."""
        if not self.prefix_cache:
            return self.context(turn)
        return self.prompt_tokens if turn == 1 else self.observation_tokens


@dataclass(frozen=True)
class PoolSpec:
    name: str
    hardware: str  # a GPU kind of scheduling.hardware
    gpus: int

    def __post_init__(self) -> None:
        get_hardware(self.hardware)  # raises naming the known kinds
        if self.gpus < 1:
            raise ValueError(f"pool {self.name!r}: gpus must be >= 1, got {self.gpus}")


@dataclass(frozen=True)
class Instance:
    """One generation instance of a model on a GPU kind (the spec-sheet roofline)."""

    hardware: str
    tp: int
    decode: StepCost
    kv_capacity_tokens: int
    max_batch: int
    watermark: float
    peak_flops: float  # of the whole instance (tp GPUs), FLOP/s


def instance_of(model: ModelSpec, hardware: str, prefill_mfu: float = PREFILL_MFU) -> Instance:
    profile = derive_profile(hardware, model.name)
    hw = get_hardware(hardware)
    return Instance(hardware, profile.tensor_parallel, profile.step_cost_model(), profile.kv_capacity_tokens,
                    profile.max_batch, profile.watermark, profile.tensor_parallel * hw.bf16_tflops * 1e12 * prefill_mfu)


def prefill_flops(model: ModelSpec, new: int, cached: int) -> float:
    """FLOPs to prefill ``new`` tokens after ``cached`` ones: matmuls + causal attention."""
    attention = 4.0 * model.layers * model.hidden * (new * cached + new * new / 2.0)
    return new * model.decode_flops_per_token() + attention


@dataclass(frozen=True)
class TaskTime:
    """One rollout step of a task on a pool: seconds in each phase on the busiest instance."""

    task: str
    pool: str
    hardware: str
    instances: int
    tp: int
    trajectories_per_instance: int
    prefill_s: float
    decode_s: float

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def prefill_share(self) -> float:
        return self.prefill_s / self.total_s if self.total_s else 0.0


def task_time(task: TaskWorkload, pool: PoolSpec, model: ModelSpec, prefill_mfu: float = PREFILL_MFU) -> TaskTime:
    """The roofline time of one rollout step of ``task`` on ``pool`` (see the module docstring)."""
    inst = instance_of(model, pool.hardware, prefill_mfu)
    n = pool.gpus // inst.tp
    if n < 1:
        raise ValueError(f"pool {pool.name!r}: {pool.gpus} x {pool.hardware} hold no instance of {model.name} "
                         f"(one needs {inst.tp} GPUs)")
    m = math.ceil(task.trajectories / n)
    prefill = decode = 0.0
    for turn in range(1, task.turns + 1):
        ctx, new = task.context(turn), task.new_tokens(turn)
        compute = m * prefill_flops(model, new, ctx - new) / inst.peak_flops
        chunks = math.ceil(m * new / PREFILL_CHUNK)
        prefill += max(compute, chunks * (inst.decode.k2 + inst.decode.k4))
        fit = int(inst.kv_capacity_tokens * (1.0 - inst.watermark) // (ctx + task.output_tokens))
        b = max(1, min(m, inst.max_batch, fit))
        full, rest = divmod(m, b)
        decode += full * inst.decode.steps(b, b * ctx, task.output_tokens)
        decode += inst.decode.steps(rest, rest * ctx, task.output_tokens)
    return TaskTime(task.name, pool.name, pool.hardware, n, inst.tp, m, prefill, decode)


def best_assignment(times: Sequence[Sequence[float]]) -> tuple[tuple[int, ...], float, float]:
    """Exact: the pool of each task (``times[k][p]``: task k alone on pool p) minimising the
    makespan max_p sum of its tasks' times, ties broken by the least total; returns (pool per
    task, makespan, total). Branch and bound, see the module docstring."""
    n_tasks = len(times)
    if n_tasks == 0:
        return (), 0.0, 0.0
    n_pools = len(times[0])
    if n_pools == 0 or any(len(row) != n_pools for row in times):
        raise ValueError("times must be a tasks x pools matrix with at least one pool")
    order = sorted(range(n_tasks), key=lambda k: (-min(times[k]), k))
    cheapest = [min(times[k]) for k in order]
    rest_min = [sum(cheapest[d:]) for d in range(n_tasks + 1)]
    column = [tuple(row[p] for row in times) for p in range(n_pools)]
    twin = [column.index(column[p]) for p in range(n_pools)]  # pools priced alike are interchangeable
    load = [0.0] * n_pools
    choice = [0] * n_tasks
    best: list = [(math.inf, math.inf), None]

    def bound(depth: int, makespan: float, total: float) -> float:
        lb = max(makespan, (total + rest_min[depth]) / n_pools)
        for k in order[depth:]:
            lb = max(lb, min(load[p] + times[k][p] for p in range(n_pools)))
        return lb

    def visit(depth: int, makespan: float, total: float) -> None:
        if not _better(bound(depth, makespan, total), total + rest_min[depth], *best[0]):
            return
        if depth == n_tasks:
            best[0], best[1] = (makespan, total), tuple(choice)
            return
        k = order[depth]
        tried: set[tuple[int, float]] = set()
        for p in sorted(range(n_pools), key=lambda p: (load[p] + times[k][p], p)):
            if (twin[p], load[p]) in tried:  # the same branch as a twin pool's with the same load
                continue
            tried.add((twin[p], load[p]))
            load[p] += times[k][p]
            choice[k] = p
            visit(depth + 1, max(makespan, load[p]), total + times[k][p])
            load[p] -= times[k][p]

    visit(0, 0.0, 0.0)
    (makespan, total), assignment = best
    return assignment, makespan, total


def _better(makespan: float, total: float, best_makespan: float, best_total: float) -> bool:
    """(makespan, total) beats the best: a shorter makespan, or one equal up to float rounding
    (sums taken in another order) with a smaller total."""
    if makespan < best_makespan * (1 - TIE):
        return True
    return makespan <= best_makespan * (1 + TIE) and total < best_total * (1 - TIE)


@dataclass(frozen=True)
class AffinityPlan:
    model: str
    pools: tuple[PoolSpec, ...]
    times: tuple[tuple[TaskTime, ...], ...]  # [task][pool]
    mapping: dict[str, str]  # task -> pool
    makespan_s: float
    pool_busy_s: dict[str, float]  # pool -> the sum of its tasks' times

    def time(self, task: str, pool: str) -> TaskTime:
        return next(t for row in self.times for t in row if t.task == task and t.pool == pool)


def plan_affinity(tasks: Sequence[TaskWorkload], pools: Sequence[PoolSpec], model: ModelSpec | str,
                  prefill_mfu: float = PREFILL_MFU) -> AffinityPlan:
    """Price every task on every pool and map each task to one pool, least makespan first."""
    spec = get_model(model) if isinstance(model, str) else model
    if not tasks or not pools:
        raise ValueError(f"need at least one task and one pool, got {len(tasks)} and {len(pools)}")
    if len(tasks) > MAX_TASKS or len(pools) > MAX_POOLS:
        raise ValueError(f"at most {MAX_TASKS} tasks and {MAX_POOLS} pools (exact search), "
                         f"got {len(tasks)} and {len(pools)}")
    for kind, items in (("task", [t.name for t in tasks]), ("pool", [p.name for p in pools])):
        if len(set(items)) != len(items):
            raise ValueError(f"{kind} names must be unique, got {items}")
    times = tuple(tuple(task_time(t, p, spec, prefill_mfu) for p in pools) for t in tasks)
    assignment, makespan, _ = best_assignment([[tt.total_s for tt in row] for row in times])
    mapping = {t.name: pools[p].name for t, p in zip(tasks, assignment, strict=True)}
    busy = {p.name: sum(times[k][j].total_s for k, a in enumerate(assignment) if a == j) for j, p in enumerate(pools)}
    return AffinityPlan(spec.name, tuple(pools), times, mapping, makespan, busy)


def config_snippet(plan: AffinityPlan) -> dict:
    """The ``generation`` settings that serve ``plan``: one instance per ``tp`` GPUs of each pool,
    numbered pool after pool, and the task -> pool map."""
    pools, first = [], 0
    for j, pool in enumerate(plan.pools):
        n = plan.times[0][j].instances
        pools.append({"name": pool.name, "hardware": pool.hardware, "instances": list(range(first, first + n))})
        first += n
    return {"generation": {"instances": first, "pools": pools, "affinity": dict(plan.mapping)}}
