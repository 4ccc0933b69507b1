"""``braid allocate``: plan GPUs and parallel configs for the SGS and the trainer (docs/allocator.md).

Thin: argparse here; the planner and its cost models are imported when the command runs.
Exit status 2 with a message on bad input (unknown model or GPU kind, negative counts, an empty
workload, a model that fits no parallel config: memory needed vs available per GPU).
"""

from __future__ import annotations

import argparse
import json
import sys


def _allocate(ns: argparse.Namespace) -> int:
    from allocator.cluster import AllocationInputError

    try:
        from allocator.allocate import format_table, plan_files

        plan = plan_files(ns.cluster, ns.model, ns.workload, objective=ns.objective, max_iteration_s=ns.max_iteration_s)
    except AllocationInputError as err:
        print(f"braid allocate: {err}", file=sys.stderr)
        return 2
    print(json.dumps(plan, indent=2) if ns.json else format_table(plan))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("allocate", help="plan GPUs and parallel configs for generation and training (StreamRL §4.2)")
    p.add_argument("--cluster", required=True, help="cluster file (deploy/clusters/*.yaml)")
    p.add_argument("--model", required=True, help="model: qwen2.5-7b, qwen2.5-32b, qwen2.5-72b, braid-tiny")
    p.add_argument("--workload", required=True, help="workload file (deploy/workloads/*.yaml)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--objective", choices=["time", "cost"], default="time",
                   help="time: least iteration time; cost: most samples/s per unit hardware cost")
    p.add_argument("--max-iteration-s", type=float, default=None,
                   help="with --objective cost: only plans at least this fast (the cheapest way to a speed)")
    p.set_defaults(func=_allocate)
