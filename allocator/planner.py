"""Resource allocation between the SGS and the trainer (StreamRL §4.2, Algorithm 1). Pure.

Cost models (memoised per GPU count in ``CostModel``, so each is evaluated once per plan):

- ``t_gen(x)``: the simulated makespan of the workload on ``x / unit`` generation instances
  (``allocator.simulator.generation_time``: the SGS's own dispatch + LPT admission code over
  the PTL profile of the kind), x in steps of one DP unit (= the instance's TP degree);
- ``t_train(y)``: the fastest fitting DP x TP x PP config on y GPUs (``allocator.training``),
  y in steps of the training unit (a node, as training jobs are allocated; 1 below a node).

Single site (budget n, x + y <= n), objective ``time``: minimise max(T_gen(x), T_train(y)).
Algorithm 1 enumerates every (x, y); since T_train is cheap (analytic) the planner takes, for
each x, the best y <= n - x (a prefix minimum: R(x), non-decreasing in x), and T_gen, the
expensive one, is non-increasing in x up to simulation noise. The optimum sits where T_gen
crosses R: a binary search over the multiples of every instance size (where each x can use
any TP degree, so T_gen is smooth) finds the first x with T_gen(x) <= R(x), then every
allocation step within ``WINDOW`` coarse steps of it is evaluated exactly (absorbing the
non-monotonicity of odd counts and of configs that need divisible GPU counts); the best wins.
Ties go to fewer GPUs (the surplus is returned). ``brute_force_single`` evaluates every x: the
reference for tests and the bench's gap measurement.

Two sites (x <= m generation GPUs, y <= n training GPUs), objective ``time``: start from the
full allocation (m, n); the faster stage is shrunk to the fewest GPUs whose time still does
not exceed the slower stage's (binary search over its units, then the window), so the
iteration time stays that of the full allocation and the rest is returned as surplus.
(Algorithm 1 picks k minimising |P(k) - T_other|, which may pick a k slightly slower than
T_other and so lengthen the iteration; "not slower" is the reading used here.)

Objective ``cost``: throughput per unit cost, samples/s / (x c_gen + y c_train) with StreamRL
Table 1 costs (H20 = 1.00, H800 = 2.85 per GPU). For every generation allocation x the
training side is balanced (fewest units with T_train <= T_gen(x), else the fastest), and the
best ratio wins; with ``max_iteration_s`` only plans at least that fast count (the cheapest way
to reach a given speed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from allocator.simulator import generation_time
from allocator.training import TrainSearch, TrainSite, TrainWorkload, search
from services.generation.scheduling import InstanceSpec
from services.generation.scheduling.models import ModelSpec

Objective = Literal["time", "cost"]
WINDOW = 2  # DP units evaluated exactly on either side of the binary-search crossing
FLOOR_TOLERANCE = 0.01  # generation within 1% of its long-tail floor: more GPUs cannot help


@dataclass(frozen=True)
class GenPool:
    kind: str
    gpus: int  # budget (single site: the shared budget)
    cost_per_gpu: float
    specs: dict[int, InstanceSpec]  # TP degree (GPUs per instance) -> the instance's profile
    unit: int  # allocation step: a node on multi-node sites, else the smallest instance

    def __post_init__(self) -> None:
        if self.unit % min(self.specs):
            raise ValueError(
                f"generation allocation step {self.unit} is not a multiple of the smallest instance {min(self.specs)}"
            )


@dataclass(frozen=True)
class TrainPool:
    kind: str
    gpus: int
    unit: int  # allocation step (a node)
    cost_per_gpu: float
    site: TrainSite


@dataclass(frozen=True)
class GenWorkload:
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    policy: str = "lpt"
    admission: Literal["fcfs", "lpt"] = "lpt"


@dataclass
class CostModel:
    """Memoised T_gen(x) and T_train(y) of one model, workload and pair of pools."""

    model: ModelSpec
    gen: GenPool
    train: TrainPool
    gen_wl: GenWorkload
    train_wl: TrainWorkload
    gen_evals: int = 0
    _gen: dict[int, tuple[float, int]] = field(default_factory=dict)
    _train: dict[int, TrainSearch] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return len(self.gen_wl.output_tokens)

    def gen_choice(self, x: int) -> tuple[float, int]:
        """(T_gen, TP degree) of the fastest instance size on x GPUs: x / tp instances of each tp
        dividing x are simulated, the fastest wins; a tp whose floor (its longest sample alone)
        is already slower than the best found is skipped (tried in order of their floors)."""
        if x not in self._gen:
            best = (math.inf, min(self.gen.specs))
            for floor, tp in sorted((self._alone(spec), tp) for tp, spec in self.gen.specs.items()):
                if x % tp or floor >= best[0]:
                    continue
                spec = self.gen.specs[tp]
                self.gen_evals += 1
                t = generation_time(
                    self.gen_wl.prompt_tokens, self.gen_wl.output_tokens, spec, x // tp,
                    policy=self.gen_wl.policy, admission=self.gen_wl.admission,
                    # the workload's lengths are known (oracle)
                    estimates=[float(v) for v in self.gen_wl.output_tokens],
                )
                best = min(best, (t, tp))
            self._gen[x] = best
        return self._gen[x]

    def t_gen(self, x: int) -> float:
        return self.gen_choice(x)[0]

    def _alone(self, spec: InstanceSpec) -> float:
        return max(spec.cost.prefill(p, 1) + spec.cost.steps(1, p, o)
                   for p, o in zip(self.gen_wl.prompt_tokens, self.gen_wl.output_tokens, strict=True))

    def gen_floor(self) -> float:
        """A lower bound of T_gen on any number of GPUs: the longest sequence decoding alone
        on the fastest instance size (the long tail's floor)."""
        return min(self._alone(spec) for spec in self.gen.specs.values())

    def train_search(self, y: int) -> TrainSearch:
        if y not in self._train:
            self._train[y] = search(self.model, y, self.train.site, self.train_wl)
        return self._train[y]

    def t_train(self, y: int) -> float:
        best = self.train_search(y).best
        return best.total_s if best is not None else math.inf

    def train_parallel(self, y: int) -> str:
        best = self.train_search(y).best
        assert best is not None, "a plan's training side always fits"
        return best.cfg.label()

    def cost(self, x: int, y: int) -> float:
        return x * self.gen.cost_per_gpu + y * self.train.cost_per_gpu


@dataclass(frozen=True)
class Plan:
    gen_gpus: int
    train_gpus: int
    gen_parallel: str
    train_parallel: str
    t_gen_s: float
    t_train_s: float
    iteration_s: float
    samples_per_s: float
    samples_per_s_per_cost: float
    cost: float
    gen_kind: str
    train_kind: str
    surplus_gen_gpus: int
    surplus_train_gpus: int
    mode: Literal["single-site", "two-site"]
    objective: Objective
    gen_evals: int = 0


def make_plan(cm: CostModel, x: int, y: int, *, mode: str, objective: Objective, budget: tuple[int, int]) -> Plan:
    tg, tt = cm.t_gen(x), cm.t_train(y)
    it = max(tg, tt)
    sps = cm.batch_size / it
    surplus = (budget[0] - x - y, 0) if mode == "single-site" else (budget[0] - x, budget[1] - y)
    return Plan(
        gen_gpus=x, train_gpus=y, gen_parallel=f"DP{x // cm.gen_choice(x)[1]}xTP{cm.gen_choice(x)[1]}",
        train_parallel=cm.train_parallel(y),
        t_gen_s=tg, t_train_s=tt, iteration_s=it, samples_per_s=sps, samples_per_s_per_cost=sps / cm.cost(x, y),
        cost=cm.cost(x, y), gen_kind=cm.gen.kind, train_kind=cm.train.kind, surplus_gen_gpus=surplus[0],
        surplus_train_gpus=surplus[1], mode=mode, objective=objective, gen_evals=cm.gen_evals,  # type: ignore[arg-type]
    )


def evaluate_two_sites(cm: CostModel, x: int, y: int) -> Plan:
    """A given two-site allocation (x generation GPUs, y training GPUs) priced by the cost model a
    plan is made with (a baseline beside the plan, e.g. an even split): any x that an instance
    size divides (not only whole allocation steps), any y whose trainer fits; ``ValueError``
    for what the sites cannot hold or the trainer cannot run on."""
    if not 1 <= x <= cm.gen.gpus or not 1 <= y <= cm.train.gpus:
        raise ValueError(f"allocation ({x}, {y}) is outside the sites' budgets ({cm.gen.gpus}, {cm.train.gpus})")
    if cm.t_gen(x) == math.inf:
        raise ValueError(f"no generation instance size ({sorted(cm.gen.specs)} GPUs) divides {x} GPUs")
    if cm.t_train(y) == math.inf:
        why = cm.train_search(y).why_not(cm.model.name, cm.train.kind)
        raise ValueError(f"no training allocation fits on {y} GPUs: {why}")
    return make_plan(cm, x, y, mode="two-site", objective="time", budget=(cm.gen.gpus, cm.train.gpus))


def _units(unit: int, hi: int) -> list[int]:
    return list(range(unit, hi + 1, unit))


def _first_true(xs: Sequence[int], pred: Callable[[int], bool]) -> int:
    """Index of the first x with pred(x) (pred assumed monotone False..True); len(xs) if none."""
    lo, hi = 0, len(xs)
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(xs[mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _train_prefix(cm: CostModel, budget: int) -> dict[int, int]:
    """For every training budget b (in units), the y <= b with the least T_train (ties: fewer)."""
    best_y, out = 0, {}
    for y in _units(cm.train.unit, budget):
        if best_y == 0 or cm.t_train(y) < cm.t_train(best_y):
            best_y = y
        out[y] = best_y
    return out


def _feasible_train(cm: CostModel, budget: int, kind: str) -> None:
    ys = _units(cm.train.unit, budget)
    if not ys:
        raise ValueError(f"{budget} GPUs left for training are fewer than one training unit ({cm.train.unit} GPUs)")
    if all(cm.t_train(y) == math.inf for y in ys):
        raise ValueError(f"no training allocation fits: {cm.train_search(ys[-1]).why_not(cm.model.name, kind)}")


def _time_single(cm: CostModel, n: int) -> tuple[int, int]:
    prefix = _train_prefix(cm, n - cm.gen.unit)
    xs = [x for x in _units(cm.gen.unit, n) if (n - x) // cm.train.unit * cm.train.unit in prefix
          and cm.t_train(prefix[(n - x) // cm.train.unit * cm.train.unit]) < math.inf]
    if not xs:
        raise ValueError(
            f"{n} GPUs leave no room for one generation instance ({cm.gen.unit} GPUs) and a fitting trainer"
        )

    def y_of(x: int) -> int:
        return prefix[(n - x) // cm.train.unit * cm.train.unit]

    enough = (1.0 + FLOOR_TOLERANCE) * cm.gen_floor()
    # coarse pass over multiples of every instance size (there T_gen is smooth: each x can use
    # any TP degree), then every allocation step around the crossing is evaluated exactly
    coarse = math.lcm(cm.gen.unit, *cm.gen.specs)
    grid = [x for x in xs if x % coarse == 0] or xs
    i = _first_true(grid, lambda x: cm.t_gen(x) <= max(cm.t_train(y_of(x)), enough))
    lo, hi = grid[max(0, i - WINDOW)], grid[min(len(grid) - 1, i + WINDOW)]
    window = [x for x in xs if lo - coarse < x <= hi]
    x = min(window, key=lambda v: (max(cm.t_gen(v), cm.t_train(y_of(v))), v + y_of(v)))
    y = y_of(x)
    it = max(cm.t_gen(x), cm.t_train(y))  # return the surplus: fewest GPUs per stage within the iteration time
    x = _shrink([v for v in xs if v <= x], cm.t_gen, it)
    y = _shrink([v for v in _units(cm.train.unit, y) if cm.t_train(v) < math.inf], cm.t_train, it)
    return x, y


def _shrink(xs: Sequence[int], t: Callable[[int], float], target: float) -> int:
    """Fewest GPUs in ``xs`` whose time does not exceed ``target`` (window around the search)."""
    i = min(_first_true(xs, lambda x: t(x) <= target), len(xs) - 1)
    window = xs[max(0, i - WINDOW): i + WINDOW + 1]
    ok = [x for x in window if t(x) <= target]
    return min(ok) if ok else xs[-1]


def _time_two(cm: CostModel, m: int, n: int) -> tuple[int, int]:
    xs, ys = _units(cm.gen.unit, m), [y for y in _units(cm.train.unit, n) if cm.t_train(y) < math.inf]
    if not xs:
        raise ValueError(f"{m} generation GPUs are fewer than one instance ({cm.gen.unit} GPUs)")
    x, y = xs[-1], min(ys, key=lambda v: (cm.t_train(v), v))  # full allocation (the fastest trainer within n)
    tg, tt = cm.t_gen(x), cm.t_train(y)
    if tg < tt:
        return _shrink(xs, cm.t_gen, tt), y
    return x, _shrink([v for v in ys if v <= y], cm.t_train, tg)


def _cost_pairs(cm: CostModel, xs: Sequence[int], train_budget: Callable[[int], int]) -> list[tuple[int, int]]:
    """For each x, the balanced training allocation: fewest units with T_train <= T_gen(x)."""
    pairs = []
    for x in xs:
        ys = [y for y in _units(cm.train.unit, train_budget(x)) if cm.t_train(y) < math.inf]
        if ys:
            ok = [y for y in ys if cm.t_train(y) <= cm.t_gen(x)]
            pairs.append((x, min(ok) if ok else min(ys, key=lambda v: (cm.t_train(v), v))))
    return pairs


def _best_cost(cm: CostModel, pairs: list[tuple[int, int]], max_iteration_s: float | None) -> tuple[int, int]:
    def it(p: tuple[int, int]) -> float:
        return max(cm.t_gen(p[0]), cm.t_train(p[1]))

    ok = [p for p in pairs if max_iteration_s is None or it(p) <= max_iteration_s]
    if not ok:
        fastest = min(it(p) for p in pairs) if pairs else math.inf
        raise ValueError(f"no allocation reaches an iteration time of {max_iteration_s} s (fastest: {fastest:.1f} s)")
    return max(ok, key=lambda p: (cm.batch_size / it(p) / cm.cost(*p), -cm.cost(*p)))


def plan_single_site(
    cm: CostModel, n: int, objective: Objective = "time", max_iteration_s: float | None = None
) -> Plan:
    """Algorithm 1, single datacenter: x + y <= n GPUs of one kind."""
    if n < 1:
        raise ValueError(f"GPU budget must be >= 1, got {n}")
    if n < cm.gen.unit + cm.train.unit:
        raise ValueError(f"{n} GPUs cannot hold one generation instance ({cm.gen.unit} GPUs: weights + KV cache) "
                         f"and one training unit ({cm.train.unit} GPUs)")
    _feasible_train(cm, n - cm.gen.unit, cm.train.kind)
    if objective == "time":
        x, y = _time_single(cm, n)
    else:
        pairs = _cost_pairs(cm, _units(cm.gen.unit, n - cm.train.unit), lambda x: n - x)
        x, y = _best_cost(cm, pairs, max_iteration_s)
    return make_plan(cm, x, y, mode="single-site", objective=objective, budget=(n, 0))


def plan_two_sites(
    cm: CostModel, m: int, n: int, objective: Objective = "time", max_iteration_s: float | None = None
) -> Plan:
    """Algorithm 1, cross datacenter: x <= m generation GPUs, y <= n training GPUs."""
    if m < 1 or n < 1:
        raise ValueError(f"GPU budgets must be >= 1, got m={m}, n={n}")
    if m < cm.gen.unit:
        raise ValueError(
            f"{m} generation GPUs cannot hold one generation instance ({cm.gen.unit} GPUs: weights + KV cache)"
        )
    _feasible_train(cm, n, cm.train.kind)
    if objective == "time":
        x, y = _time_two(cm, m, n)
    else:
        x, y = _best_cost(cm, _cost_pairs(cm, _units(cm.gen.unit, m), lambda _x: n), max_iteration_s)
    return make_plan(cm, x, y, mode="two-site", objective=objective, budget=(m, n))


def brute_force_single(cm: CostModel, n: int) -> tuple[int, int, float]:
    """Every (x, y) with x + y <= n in DP-unit steps: (x, y, min max(T_gen, T_train))."""
    best = (0, 0, math.inf)
    for x in _units(cm.gen.unit, n):
        tg = cm.t_gen(x)
        for y in _units(cm.train.unit, n - x):
            t = max(tg, cm.t_train(y))
            if t < best[2]:
                best = (x, y, t)
    return best


def brute_force_two(cm: CostModel, m: int, n: int) -> tuple[int, int, float]:
    """Every (x, y) with x <= m, y <= n: (x, y, least max(T_gen, T_train)), ties to fewer GPUs."""
    best = (0, 0, math.inf)
    for x in _units(cm.gen.unit, m):
        for y in _units(cm.train.unit, n):
            t = max(cm.t_gen(x), cm.t_train(y))
            if t < best[2] or (t == best[2] and x + y < best[0] + best[1]):
                best = (x, y, t)
    return best

