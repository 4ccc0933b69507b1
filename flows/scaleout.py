"""The scale-out controller of a local run: StreamRL §4.2 "Dynamic adjustment" wired to processes.

Lives in the launcher's watcher loop (``flows.launcher.run_processes`` calls ``poll()`` every
half second while the trainer runs), the thinnest place that already supervises the processes:
the trainer keeps training and is never paused or told anything.

Each poll reads the iterations the trainer appended to ``metrics.jsonl`` since the last poll
(T_gen = ``allocator.scaleout.generation_time`` of the row's first sample start and last sample
finish, net of overlap with the previous iteration; T_train = ``train_time_s``, the trainer's
busy time), and for each asks the pure policy
(``allocator.scaleout.decide``). The action runs on one background thread (supervised: its
failure is raised by the next ``poll``), so the watcher keeps checking the other processes:

- ``out``: start the decision's units (one, or up to ``scaleout.max_step``): one more SGS instance
  process each through the launcher's ``Supervisor``, pinned to
  ``scaleout.cpus`` (on one host: the trainer's core, which idles while generation is behind;
  default ``generation.cpus``), with the next relay when the run uses the relay transport, then
  ``AddInstance`` on the router, which brings it to the current weights before it gets prompts
  (without a router: the rollout's membership file, ``FileMembership``; the trainer's
  orchestrator brings it up the same way). On the emulated engine the units are standby instances
  the launcher started with the run (``StandbyUnits``): an added one waits out the modelled start
  (``scaleout.emulated_start_s`` x ``time_scale``) rather than a Python process's start-up, which
  is this machine's cost, not the modelled accelerator's (unscaled, it is tens of modelled minutes);
- ``in``: ``RemoveInstance`` for the most recently added instance (the router, or the
  orchestrator, stops giving it work and waits until it returned its in-flight sequences), then
  stop its process.

Every decision and event is appended to ``scaleout.jsonl`` in the run directory (the bench and
the report read it). An iteration is attributed to the instance count at the time its metrics
row is read, and the policy's cooldown counts from the last iteration read when the change took
effect (the new instance joined the router), so iterations generated partly before it are not
mistaken for the new configuration (in ``one_step`` mode the next iteration was dispatched
before the change).
"""

from __future__ import annotations

import contextvars
import json
import logging
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Protocol

from allocator.scaleout import IterationTiming, ScaleoutLimits, decide, generation_time

log = logging.getLogger("braid.scaleout")


class Units(Protocol):
    """Starts and stops the processes of added SGS instances: local processes (``ProcessUnits``)
    or, in two-site mode, flow runs on the generation site's work pool (``flows.two_site.PoolUnits``)."""

    def start(self, index: int) -> tuple[str, object, dict]:
        """Start instance ``index``; block until it serves; return (its address, a handle, log fields)."""

    def stop(self, handle: object) -> None:
        """Stop an instance the router no longer routes to (it has returned all its work)."""


class ProcessUnits:
    """Added instances as child processes of the launcher's ``Supervisor`` (one host), one each.

    ``members``: the run's own instances the controller may remove, (address, its process's
    ``Service``); a process serving several (``--instances``, the emulated engine) is stopped
    when the last of them has left, not before."""

    def __init__(self, sup, run_dir: Path, cfg, checkpoint: str, relays: list[str],
                 members: list[tuple[str, object]] = ()) -> None:
        self.sup, self.run_dir, self.cfg, self.checkpoint, self.relays = sup, run_dir, cfg, checkpoint, relays
        self.serving = Counter(handle.name for _, handle in members)  # instances still served, by process name

    def start(self, index: int) -> tuple[str, object, dict]:
        from flows.processes import start_instances

        cpus = self.cfg.scaleout.cpus or self.cfg.generation.cpus
        (address,) = start_instances(self.sup, self.run_dir, self.checkpoint, 1, self.cfg.generation.threads,
                                     first=index, cpus=cpus, relays=self.relays or None)
        handle = self.sup.services[-1]
        self.serving[handle.name] += 1
        return address, handle, {"cpus": cpus}

    def stop(self, handle: object) -> None:
        self.serving[handle.name] -= 1
        if self.serving[handle.name] > 0:
            log.info("%s still serves %d instances: it runs on", handle.name, self.serving[handle.name])
            return
        handle.expect_exit = True  # a clean exit is no longer a failure
        handle.proc.terminate()


class StandbyUnits:
    """Added instances from a pool of standby instances the launcher started with the run (the
    emulated engine: its processes serve many instances each, and an idle one costs no CPU). An
    added instance waits out ``start_s`` (modelled start x time scale) before it serves; a removed
    one returns to the pool (its process serves the others). ``parallel``: several start at once."""

    parallel = True

    def __init__(self, pool: list[str], start_s: float, sleep=time.sleep) -> None:
        self.pool, self.start_s, self.sleep = list(pool), start_s, sleep
        self._lock = threading.Lock()

    def start(self, index: int) -> tuple[str, object, dict]:
        with self._lock:
            if not self.pool:
                raise RuntimeError(f"no standby instance left for instance {index} (scaleout.max_instances)")
            address = self.pool.pop(0)
        self.sleep(self.start_s)
        return address, address, {"standby": True, "modelled_start_wall_s": self.start_s}

    def stop(self, handle: object) -> None:
        with self._lock:
            self.pool.append(str(handle))


class FileMembership:
    """Instances joining and leaving a run whose trainer dials them itself (no router): through the
    rollout's membership file (``services/rollout/membership.py``), answered in its ack file. The
    same two calls as the router client's ``add_instance``/``remove_instance``."""

    POLL_S = 0.2

    def __init__(self, run_dir: Path, addresses: list[str]) -> None:
        from services.rollout.membership import ACK, MEMBERSHIP

        self.path, self.ack_path = run_dir / MEMBERSHIP, run_dir / ACK
        self.states = dict.fromkeys(addresses, "active")
        self._write()

    def _write(self) -> None:
        from services.common.atomic import write_json_atomic

        write_json_atomic(self.path, {"instances": [{"address": a, "state": s} for a, s in self.states.items()]})

    def _wait(self, address: str, state: str, wait_s: float) -> dict:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                ack = json.loads(self.ack_path.read_text()).get(address, {})
            except (FileNotFoundError, ValueError):
                ack = {}
            if ack.get("state") == state:
                return ack
            time.sleep(self.POLL_S)
        raise TimeoutError(f"the trainer did not report {address} {state} within {wait_s:.0f}s ({self.ack_path})")

    def add_instance(self, address: str, *, wait_s: float = 60.0) -> tuple[list[str], int]:
        self.states[address] = "active"
        self._write()
        ack = self._wait(address, "joined", 2 * wait_s + 60)  # its bring-up includes the newest weights
        return [a for a, s in self.states.items() if s == "active"], int(ack.get("version", -1))

    def remove_instance(self, address: str, *, wait_s: float = 600.0) -> tuple[list[str], int]:
        self.states[address] = "leaving"
        self._write()
        ack = self._wait(address, "drained", wait_s)
        del self.states[address]
        self._write()
        return [a for a, s in self.states.items() if s == "active"], int(ack.get("held", 0))

    def close(self) -> None:
        pass


class ScaleoutController:
    """``members`` are the instances the controller may remove, (address, handle) oldest first;
    routed instances not among them (a generation site's own, in two-site mode) stay to the end,
    so scale-in never goes below their number."""

    def __init__(
        self, run_dir: Path, cfg, router: str | FileMembership, instances: list[str], units: Units,
        members: list[tuple[str, object]], *, tls=None,
    ) -> None:
        """``router``: the SGS router's address, or ``FileMembership`` when the trainer dials the
        instances itself."""
        from services.generation.client import GenerationClient

        so = cfg.scaleout
        self.run_dir, self.cfg, self.units = run_dir, cfg, units
        fixed = len(instances) - len(members)
        self.limits = ScaleoutLimits(max(so.min_instances, fixed, 1), so.max_instances, so.window, so.cooldown,
                                     so.scale_in, so.scale_in_margin, so.max_step)
        self.router = router if isinstance(router, FileMembership) else GenerationClient(
            router, max_message_mb=cfg.generation.max_message_mb, tls=tls)
        self.instances = list(instances)  # routed addresses, oldest first
        self.members = list(members)
        self.history: list[IterationTiming] = []
        self.last_change: int | None = None
        self.next_index = len(instances)
        self.rows_seen = 0
        self._prev_finish: float | None = None  # last sample finish of the previous iteration
        self.events_path = run_dir / "scaleout.jsonl"
        self.metrics_path = run_dir / "metrics.jsonl"
        self._busy: threading.Thread | None = None
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ watcher side
    def poll(self) -> None:
        """Read new iterations, decide, start the action in the background. Raises a failed action."""
        if self._error is not None:
            raise RuntimeError(f"scale-out action failed: {self._error}") from self._error
        for row in self._new_rows():
            t_gen = generation_time(row["gen_first_start"], row["gen_last_finish"], self._prev_finish)
            self._prev_finish = row["gen_last_finish"]
            timing = IterationTiming(int(row["iteration"]), t_gen, float(row["train_time_s"]), len(self.instances))
            self.history.append(timing)
            busy = self._busy is not None and self._busy.is_alive()
            decision = decide(self.history, len(self.instances), self.limits, self.last_change)
            self._log({"event": "decision", "iteration": timing.iteration, "t_gen_s": timing.t_gen_s,
                       "t_train_s": timing.t_train_s, "delta_s": timing.delta_s, "instances": timing.instances,
                       "window_delta_s": decision.delta_s, "delta_prime_s": decision.delta_prime_s,
                       "action": "hold" if busy else decision.action,
                       "reason": "a change is in progress" if busy else decision.reason})
            if decision.action != "hold" and not busy:
                self.last_change = timing.iteration
                # the thread runs in a copy of this context: a Prefect flow run's context makes a unit's flow run
                # its subflow
                self._busy = threading.Thread(
                    target=contextvars.copy_context().run,
                    args=(self._act, decision.action, timing.iteration, abs(decision.instances - timing.instances)),
                    name="scaleout", daemon=True,
                )
                self._busy.start()

    def wait(self, timeout_s: float = 300.0) -> None:
        """Let an action in progress finish (the run is ending); raise if it failed."""
        if self._busy is not None:
            self._busy.join(timeout_s)
        if self._error is not None:
            raise RuntimeError(f"scale-out action failed: {self._error}") from self._error

    def close(self) -> None:
        self.router.close()

    def _new_rows(self) -> list[dict]:
        if not self.metrics_path.exists():
            return []
        text = self.metrics_path.read_text()
        lines = [x for x in text[: text.rfind("\n") + 1].splitlines() if x.strip()]  # a row being written waits
        rows = [json.loads(x) for x in lines[self.rows_seen :]]
        self.rows_seen += len(rows)
        return rows

    # ------------------------------------------------------------------ action thread
    def _act(self, action: str, iteration: int, units: int = 1) -> None:
        try:
            if action == "out":
                self._scale_out(iteration, max(1, units))
            else:
                self._scale_in(iteration)
        except BaseException as exc:  # noqa: BLE001 - surfaced by the next poll()
            self._error = exc
            return
        # the cooldown counts from the iteration during which the change took effect, not from the decision
        self.last_change = max(iteration, self.history[-1].iteration)

    def _scale_out(self, iteration: int, units: int = 1) -> None:
        """Start ``units`` instances (at once when the units allow it), then let each join the router."""
        from concurrent.futures import ThreadPoolExecutor

        from flows.processes import SGS_READY_TIMEOUT_S

        t0 = time.time()
        first, self.next_index = self.next_index, self.next_index + units
        indices = range(first, first + units)
        if units > 1 and getattr(self.units, "parallel", False):
            with ThreadPoolExecutor(units, thread_name_prefix="scaleout-start") as pool:
                started_units = list(pool.map(self.units.start, indices))
        else:
            started_units = [self.units.start(i) for i in indices]
        started = time.time()
        for address, handle, fields in started_units:
            joining = time.time()
            instances, version = self.router.add_instance(address, wait_s=SGS_READY_TIMEOUT_S)
            self.members.append((address, handle))
            self.instances = instances
            self._log({"event": "scale_out", "iteration": iteration, "address": address, **fields,
                       "weight_version": version, "instances": len(instances), "start_s": started - t0,
                       "join_s": time.time() - joining, "units": units})
            log.info("scale-out after iteration %d: %s joined at weight version %d (%d instances)", iteration,
                     address, version, len(instances))

    def _scale_in(self, iteration: int) -> None:
        t0 = time.time()
        address, handle = self.members.pop()  # the newest instance leaves first
        instances, drained = self.router.remove_instance(address, wait_s=self.cfg.scaleout.drain_timeout_s)
        self.instances = instances
        self.units.stop(handle)
        self._log({"event": "scale_in", "iteration": iteration, "address": address, "drained": drained,
                   "instances": len(instances), "drain_s": time.time() - t0})
        log.info("scale-in after iteration %d: %s left after %d in-flight sequences (%d instances)", iteration,
                 address, drained, len(instances))

    def _log(self, row: dict) -> None:
        with self.events_path.open("a") as f:
            f.write(json.dumps({"t": time.time(), **row}) + "\n")
