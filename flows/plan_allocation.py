"""Prefect flow ``plan_allocation``: the allocator as a standalone planning step (StreamRL §4.2).

Wires one step and passes paths only: ``plan`` reads the cluster and workload files and runs
the planner (``allocator.allocate.plan_files``: profile-based cost models, Algorithm 1), then
the flow publishes the plan as a markdown artifact (the table ``braid allocate`` prints) and a
table artifact (one row per stage), optionally writes the JSON to ``out``, and returns it. The
returned JSON (or the file) is what ``rl_training``'s ``plan`` parameter takes.

Bad input fails the run with the same message ``braid allocate`` prints (file, field, or
memory needed vs available per GPU).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from pydantic import Field

from services.common.config import StrictModel


class PlanParams(StrictModel):
    """Inputs of one planning run (rendered as a form in the Prefect UI)."""

    cluster_file: str = Field("deploy/clusters/local-cpu.yaml", description="Cluster file: sites, GPU kinds, counts, "
                              "interconnect, costs (deploy/clusters/; default: this machine's cores).")
    model: str = Field("braid-tiny", description="Model: qwen2.5-7b, qwen2.5-32b, qwen2.5-72b or braid-tiny "
                       "(default: the local tiny model, whose plan sets a run's SGS instances).")
    workload_file: str = Field("deploy/workloads/tiny.yaml", description="Workload file: batch size and "
                               "prompt/response lengths (deploy/workloads/).")
    objective: Literal["time", "cost"] = Field("time", description="time: least iteration time; cost: most "
                                               "samples/s per cost.")
    max_iteration_s: float | None = Field(None, gt=0, le=1e7,
                                          description="Cost objective: only plans at least this fast.")
    out: str | None = Field(None, description="Also write the plan JSON to this path.")


@task(name="plan")
def plan_step(
    cluster_file: str, model: str, workload_file: str, objective: str, max_iteration_s: float | None
) -> dict[str, Any]:
    from allocator.allocate import plan_files

    return plan_files(cluster_file, model, workload_file, objective=objective,  # type: ignore[arg-type]
                      max_iteration_s=max_iteration_s)


def stage_rows(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"stage": "generation (SGS)", "gpus": plan["gen_gpus"], "kind": plan["gen_kind"],
         "parallel": plan["gen_parallel"], "predicted_s": round(plan["t_gen_s"], 2),
         "surplus_gpus": plan["surplus_gen_gpus"]},
        {"stage": "training", "gpus": plan["train_gpus"], "kind": plan["train_kind"],
         "parallel": plan["train_parallel"], "predicted_s": round(plan["t_train_s"], 2),
         "surplus_gpus": plan["surplus_train_gpus"]},
    ]


@flow(name="plan_allocation", log_prints=True)
def plan_allocation(params: PlanParams | None = None) -> dict[str, Any]:
    """Plan GPUs and parallel configs for the SGS and the trainer; publish the plan as artifacts.

    Args:
        params: What to plan for; empty: the local tiny model on this machine (PlanParams' defaults).
    """
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    from allocator.allocate import format_table

    params = params or PlanParams()
    plan = plan_step(params.cluster_file, params.model, params.workload_file, params.objective, params.max_iteration_s)
    get_run_logger().info("plan: %d generation + %d training GPUs, iteration %.1f s, %.3f samples/s",
                          plan["gen_gpus"], plan["train_gpus"], plan["iteration_s"], plan["samples_per_s"])
    create_markdown_artifact(f"```\n{format_table(plan)}\n```\n", key="allocation-plan",
                             description=f"Allocation plan: {plan['model']} on {plan['cluster']}")
    create_table_artifact(stage_rows(plan), key="allocation-plan-stages",
                          description=f"GPUs per stage, iteration {plan['iteration_s']:.1f} s")
    if params.out:
        Path(params.out).parent.mkdir(parents=True, exist_ok=True)
        Path(params.out).write_text(json.dumps(plan, indent=2) + "\n")
    return plan
