"""``braid affinity``: a task-mix file in, a task -> pool mapping and its config out (docs/affinity.md).

The edge around the pure planner ``allocator.affinity``: reads and validates the file, plans,
formats the result as a table or one JSON object. Task-mix file
(``deploy/workloads/affinity/*.yaml``)::

    name: rollart-fig4
    model: qwen2.5-7b              # services/generation/scheduling/models.py
    pools:                         # GPUs of each kind available for rollouts
      - {name: compute, gpu: H800, gpus: 2}
      - {name: bandwidth, gpu: H20, gpus: 6}
    tasks:                         # per rollout step
      - {name: frozenlake, trajectories: 128, turns: 30, prompt_tokens: 300,
         observation_tokens: 120, output_tokens: 40, prefix_cache: true}

Every input problem raises ``AllocationInputError`` naming the file and field.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from allocator.affinity import (
    MAX_POOLS,
    MAX_TASKS,
    PREFILL_CHUNK,
    PREFILL_MFU,
    PoolSpec,
    TaskWorkload,
    config_snippet,
    plan_affinity,
)
from allocator.cluster import AllocationInputError, load_input
from services.common.config import StrictModel
from services.generation.scheduling.hardware import HARDWARE
from services.generation.scheduling.models import MODELS
from services.generation.scheduling.profiles import BW_EFFICIENCY, FLOPS_EFFICIENCY, STEP_OVERHEAD_S

NAME = r"^[A-Za-z0-9_.:-]+$"  # the charset of task tags and pool names (services.common.pool_config)


class PoolEntry(StrictModel):
    name: str = Field(min_length=1, max_length=64, pattern=NAME,
                      description="Pool name (becomes generation.pools[].name).")
    gpu: str = Field(min_length=1, description="GPU kind of scheduling.hardware: H20, H800, H100.")
    gpus: int = Field(ge=1, le=100_000, description="GPUs of the pool available for rollouts.")


class TaskEntry(StrictModel):
    name: str = Field(min_length=1, max_length=64, pattern=NAME,
                      description="Task tag (PromptSpec.task, generation.affinity key).")
    trajectories: int = Field(ge=1, le=10_000_000, description="Trajectories of this task per rollout step.")
    turns: int = Field(ge=1, le=10_000, description="Turns (generate + environment step) per trajectory.")
    prompt_tokens: int = Field(ge=1, le=10_000_000, description="First turn's prompt, tokens.")
    observation_tokens: int = Field(ge=0, le=10_000_000,
                                    description="Environment tokens appended before each later turn.")
    output_tokens: int = Field(ge=1, le=10_000_000, description="Tokens generated per turn (action and reasoning).")
    prefix_cache: bool = Field(
        True, description="Earlier turns' KV is reused (false: the whole context is prefilled each turn).")


class AffinityFile(StrictModel):
    """A task mix and the GPU pools that may generate it."""

    name: str = Field(min_length=1, description="Task-mix name.")
    description: str = Field("", description="Free text.")
    model: str = Field(min_length=1, description="The served model (services/generation/scheduling/models.py).")
    pools: list[PoolEntry] = Field(min_length=1, max_length=MAX_POOLS, description="Rollout GPU pools.")
    tasks: list[TaskEntry] = Field(min_length=1, max_length=MAX_TASKS, description="Tasks of one rollout step.")

    @model_validator(mode="after")
    def _consistent(self) -> AffinityFile:
        for kind, names in (("pool", [p.name for p in self.pools]), ("task", [t.name for t in self.tasks])):
            if len(set(names)) != len(names):
                raise ValueError(f"{kind} names must be unique, got {names}")
        unknown = [p.gpu for p in self.pools if p.gpu not in HARDWARE]
        if unknown:
            raise ValueError(f"unknown GPU kinds {unknown}; known: {sorted(HARDWARE)}")
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; known: {sorted(MODELS)}")
        return self


def load_affinity_file(path: str | Path) -> AffinityFile:
    return load_input(AffinityFile, path, "task-mix")


def plan_file(path: str | Path, model: str | None = None, prefill_mfu: float = PREFILL_MFU) -> dict:
    """Plan the file's task mix (``model`` overrides the file's); a JSON-able dict."""
    spec = load_affinity_file(path)
    model_name = model or spec.model
    if model_name not in MODELS:
        raise AllocationInputError(f"unknown model {model_name!r}; known: {sorted(MODELS)}")
    tasks = [TaskWorkload(t.name, t.trajectories, t.turns, t.prompt_tokens, t.observation_tokens, t.output_tokens,
                          t.prefix_cache) for t in spec.tasks]
    pools = [PoolSpec(p.name, p.gpu, p.gpus) for p in spec.pools]
    try:
        plan = plan_affinity(tasks, pools, model_name, prefill_mfu)
    except ValueError as err:
        raise AllocationInputError(f"{path}: {err}") from None
    return {
        "name": spec.name, "model": model_name,
        "pools": [{"name": p.name, "gpu": p.hardware, "gpus": p.gpus, "instances": plan.times[0][j].instances,
                   "tp": plan.times[0][j].tp, "cost": _cost(p), "busy_s": plan.pool_busy_s[p.name]}
                  for j, p in enumerate(pools)],
        "times": [{"task": t.task, "pool": t.pool, "gpu": t.hardware, "prefill_s": t.prefill_s, "decode_s": t.decode_s,
                   "total_s": t.total_s, "prefill_share": t.prefill_share,
                   "trajectories_per_instance": t.trajectories_per_instance}
                  for row in plan.times for t in row],
        "mapping": plan.mapping, "makespan_s": plan.makespan_s,
        "config": config_snippet(plan),
        "assumptions": {"prefill_mfu": prefill_mfu, "prefill_chunk_tokens": PREFILL_CHUNK,
                        "bw_efficiency": BW_EFFICIENCY, "decode_flops_efficiency": FLOPS_EFFICIENCY,
                        "step_overhead_s": STEP_OVERHEAD_S},
        "source": "roofline of the GPU spec sheets (services/generation/scheduling/hardware.py), not measured on a GPU",
    }


def _cost(pool: PoolSpec) -> float | None:
    cost = HARDWARE[pool.hardware].cost
    return None if cost is None else cost * pool.gpus


def format_table(plan: dict) -> str:
    """The plan as a text table: every task on every pool (chosen pool marked *), then the config."""
    lines = [f"{plan['name']}: {plan['model']}, one rollout step per task, {plan['source']}", ""]
    lines.append(f"{'task':<16}{'pool':<22}{'prefill s':>11}{'decode s':>11}{'total s':>11}"
                 f"{'prefill %':>11}")
    pools = {p["name"]: p for p in plan["pools"]}
    for t in plan["times"]:
        p = pools[t["pool"]]
        mark = "*" if plan["mapping"][t["task"]] == t["pool"] else " "
        where = f"{mark}{t['pool']} ({p['gpus']} x {p['gpu']})"
        lines.append(f"{t['task']:<16}{where:<22}{t['prefill_s']:>11.2f}{t['decode_s']:>11.2f}{t['total_s']:>11.2f}"
                     f"{100 * t['prefill_share']:>10.0f}%")
    mapping = ", ".join(f"{task} -> {pool}" for task, pool in plan["mapping"].items())
    busy = ", ".join(f"{p['name']} {p['busy_s']:.2f} s" for p in plan["pools"])
    lines += ["", f"mapping   {mapping}", f"makespan  {plan['makespan_s']:.2f} s (the busiest pool; busy: {busy})", "",
              "generation config (a config file's generation section):"]
    gen = plan["config"]["generation"]
    lines.append(f"  instances: {gen['instances']}")
    lines.append("  pools:")
    lines += [f"    - {{name: {p['name']}, hardware: {p['hardware']}, instances: {p['instances']}}}"
              for p in gen["pools"]]
    lines.append("  affinity:")
    lines += [f"    {task}: {pool}" for task, pool in gen["affinity"].items()]
    return "\n".join(lines)
