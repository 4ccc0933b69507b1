"""``braid follow``: follow a flow run from a terminal — its state changes and its log lines
(the run directory, one line per RL iteration, the report), not Prefect's event stream — until it
ends; the exit status says how it ended (0 completed, 1 failed/crashed/cancelled, 2 not found).

    prefect deployment run rl_training/rl-training -p sites=null -p config_path=deploy/configs/smoke.yaml
    braid follow <flow run id>             # or: braid follow --deployment rl_training/rl-training (its latest run)
    prefect flow-run cancel <flow run id>  # stop it (the services stop with it)

The server is the one the Prefect settings name (``PREFECT_API_URL``, ``PREFECT_API_AUTH_STRING``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

NOT_FOUND = 2  # the run or deployment does not exist
USAGE = 2
PAGE = 200  # log lines read per request


@dataclass(frozen=True)
class LogLine:
    timestamp: datetime
    level: int
    message: str


def format_line(line: LogLine) -> str:
    """``HH:MM:SS  message`` (warnings and errors named), one line per log record (pure)."""
    tag = "" if line.level < 30 else ("WARNING " if line.level < 40 else "ERROR ")
    return f"{line.timestamp.astimezone().strftime('%H:%M:%S')}  {tag}{line.message}"


def exit_code(state_type: str) -> int:
    """0 when the run completed, 1 when it ended any other way (pure)."""
    return 0 if state_type == "COMPLETED" else 1


async def _latest_run(client, deployment: str) -> UUID | None:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.exceptions import ObjectNotFound

    try:
        dep = await client.read_deployment_by_name(deployment)
    except ObjectNotFound:
        return None
    runs = await client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])),
                                       sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=1)
    return runs[0].id if runs else None


def _task_done(record) -> bool:
    """A task run's "Finished in state Completed()": one per task, nothing to act on (a task that
    failed, and every flow-run line, is shown)."""
    return getattr(record, "task_run_id", None) is not None and record.message.startswith("Finished in state Completed")


class LogCursor:
    """The log lines of a run not printed yet. Lines reach the server in batches and not always in
    timestamp order, so each read goes back ``LATE_S`` before the newest line seen and skips the
    lines already printed (by id): none is printed twice, none is skipped for arriving late."""

    LATE_S = 30.0

    def __init__(self) -> None:
        self.seen: set = set()
        self.newest: datetime | None = None

    def take(self, records: list) -> list[LogLine]:
        """The records not seen before, oldest first, less completed tasks' last lines (pure: records
        need ``id``, ``timestamp``, ``level``, ``message`` and ``task_run_id``)."""
        fresh = sorted((r for r in records if r.id not in self.seen), key=lambda r: r.timestamp)
        self.seen.update(r.id for r in fresh)
        if fresh:
            newest = fresh[-1].timestamp
            self.newest = newest if self.newest is None else max(self.newest, newest)
        return [LogLine(r.timestamp, r.level, r.message) for r in fresh if not _task_done(r)]

    def since(self) -> datetime | None:
        return None if self.newest is None else self.newest - timedelta(seconds=self.LATE_S)


async def _new_logs(client, run_id: UUID, cursor: LogCursor) -> list[LogLine]:
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterTimestamp
    from prefect.client.schemas.sorting import LogSort

    since = cursor.since()
    flt = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id]),
                    timestamp=LogFilterTimestamp(after_=since) if since is not None else None)
    records: list = []
    while True:
        page = await client.read_logs(log_filter=flt, limit=PAGE, offset=len(records), sort=LogSort.TIMESTAMP_ASC)
        records += page
        if len(page) < PAGE:
            return cursor.take(records)


async def follow(run_id: UUID | None, deployment: str | None, interval: float, timeout: float | None,
                 echo=print) -> int:
    """Print ``run_id``'s (or ``deployment``'s latest run's) state changes and log lines until it ends."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    async with get_client() as client:
        if run_id is None:
            run_id = await _latest_run(client, deployment)
            if run_id is None:
                echo(f"braid follow: deployment {deployment!r} not found, or it has no runs")
                return NOT_FOUND
        try:
            run = await client.read_flow_run(run_id)
        except ObjectNotFound:
            echo(f"braid follow: flow run {run_id} not found on {client.api_url}")
            return NOT_FOUND
        echo(f"following flow run {run.name} ({run_id})")
        cursor, state, deadline = LogCursor(), None, None if timeout is None else time.monotonic() + timeout
        while True:
            run = await client.read_flow_run(run_id)
            for line in await _new_logs(client, run_id, cursor):
                echo(format_line(line))
            if run.state is not None and run.state.name != state:
                state = run.state.name
                echo(f"state: {state}")
            if run.state is not None and run.state.is_final():
                await asyncio.sleep(min(interval, 1.0))  # the last log lines reach the server after the state
                for line in await _new_logs(client, run_id, cursor):
                    echo(format_line(line))
                return exit_code(run.state.type.value)
            if deadline is not None and time.monotonic() > deadline:
                echo(f"braid follow: still {state} after {timeout:.0f} s; the run goes on")
                return 1
            await asyncio.sleep(interval)


def add_parser(sub) -> None:
    p = sub.add_parser("follow", help="follow a flow run's state and log lines until it ends (exit 0: completed)")
    p.add_argument("flow_run_id", nargs="?", type=UUID, help="the flow run (`prefect deployment run` prints its id)")
    p.add_argument("--deployment", help="follow this deployment's latest run instead, e.g. rl_training/rl-training")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between polls (default 2)")
    p.add_argument("--timeout", type=float, help="give up following after this many seconds (the run goes on)")
    p.set_defaults(func=_main)


def _main(ns: argparse.Namespace) -> int:
    if (ns.flow_run_id is None) == (ns.deployment is None):
        print("braid follow: give a flow run id or --deployment FLOW/DEPLOYMENT (one of them)", file=sys.stderr)
        return USAGE
    if ns.interval <= 0:
        print(f"braid follow: --interval must be > 0, got {ns.interval}", file=sys.stderr)
        return USAGE
    from prefect.settings import get_current_settings

    if not get_current_settings().api.url:  # else the client starts a throwaway local server with no runs
        print("braid follow: no Prefect server configured: export PREFECT_API_URL (`make server` prints it)",
              file=sys.stderr)
        return USAGE
    return asyncio.run(follow(ns.flow_run_id, ns.deployment, ns.interval, ns.timeout,
                              echo=lambda s: print(s, flush=True)))
