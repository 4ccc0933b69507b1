"""``braid affinity``: map a task mix to GPU pools by hardware affinity (RollArt §4.1 P1; docs/affinity.md).

Thin: argparse here; the cost model and planner (``allocator.affinity``) load when the command
runs. Exit status 2 with a message on bad input (the file and field, an unknown model or GPU kind,
a pool too small for one instance).
"""

from __future__ import annotations

import argparse
import json
import sys


def _affinity(ns: argparse.Namespace) -> int:
    from allocator.cluster import AllocationInputError

    try:
        from allocator.affinity_files import format_table, plan_file

        plan = plan_file(ns.tasks, ns.model)
    except AllocationInputError as err:
        print(f"braid affinity: {err}", file=sys.stderr)
        return 2
    print(json.dumps(plan, indent=2) if ns.json else format_table(plan))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("affinity", help="map agentic tasks to GPU pools: prefill-heavy to compute, decode-heavy to "
                       "bandwidth (RollArt §3.1); prints the generation.pools/affinity config")
    p.add_argument("--tasks", required=True, help="task-mix file (deploy/workloads/affinity/*.yaml): pools and tasks")
    p.add_argument("--model", help="served model instead of the file's: qwen2.5-7b, qwen2.5-32b, qwen2.5-72b")
    p.add_argument("--json", action="store_true", help="one JSON object: per-task times on every pool, the mapping, "
                   "and under 'config' the generation settings to use")
    p.set_defaults(func=_affinity)
