"""One chaos run: a real run (``flows.launcher.run_processes``) with faults injected, then checked.

A ``Scenario`` names what to kill (``kill -9``) and which network fault to put on the trainer's
link to SGS instance 0 (a ``services.common.faultproxy.FaultProxy`` in this process). The kills
happen together, at the first poll after the run has taken ``kill_after`` steps (and, when the
trainer is among them, has a recovery checkpoint); the launcher's supervisor restarts what it
restarts (the trainer from its checkpoint, a relay or the router on its port), and a lost SGS
instance's trajectories resume on the others (bounded mode).

Checked after the run, with the services still up (``on_finish``):
- the consumption ledger (``services.run.ledger``): every sample consumed exactly once in the
  history that made the final weights; samples lost = expected − consumed;
- the staleness bound in every metrics row (bounded: ``bound_violations``; lock-step modes:
  ``staleness_max`` over the mode's bound);
- weights byte-exact: every live relay holds the master's final version with the same digest
  (SHA-256 over the chunk digests, so chain repair and catch-up delivered the same bytes), and
  every live SGS instance serves that version (it verified the digest when it pulled);
- recovery time: from the kill (or the fault) to the first training step finished after it.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

# what a component is on the process table: the module and an argument that names it
COMPONENTS = {
    "sgs": ("services.generation", ["--instance", "1"]),
    "relay": ("services.weights", ["--id", "relay-1"]),
    "master_relay": ("services.weights", ["--id", "relay-0"]),
    "router": ("services.generation.router_main", []),
    "trainer": ("services.run", []),  # the trainer process: the orchestrator, and its learner process with it
    "learner": ("", []),  # the learner process alone (``learner.pid``; a fork of the trainer, same command line)
}


@dataclass(frozen=True)
class Scenario:
    name: str
    # a key of CONFIGS: "bounded" (3 instances, 2 relays, repack), "routed" (one_step behind the router), a mode
    config: str
    kill: tuple[str, ...] = ()
    fault: str = ""  # "delay", "partition" or "reset" on the trainer's link to SGS instance 0
    kill_after: int = 2  # steps taken before the faults


@dataclass
class RunResult:
    scenario: str
    completed: bool = False
    error: str = ""
    faults: list[str] = field(default_factory=list)
    fault_at: float | None = None
    recovery_s: float | None = None
    restarts: dict[str, int] = field(default_factory=dict)
    ledger: dict = field(default_factory=dict)
    samples_expected: int = 0
    samples_lost: int = 0
    duplicates: int = 0
    violations: int = 0
    weights: dict = field(default_factory=dict)
    steps_before_fault: int | None = None  # training steps finished when the faults came
    rl_seconds: float | None = None  # the training phase's length (the faults land inside it)
    wall_s: float = 0.0
    config: str = ""  # the scenario's CONFIGS key
    learner_revivals: list[dict] = field(default_factory=list)  # learner-restarts.jsonl: replayed steps, groups at risk
    # trajectories generated again or thrown away because of the kill: rolled-back groups and
    # in-flight groups the restarted trainer regenerated, times the group size
    trajectories_lost: int = 0
    rolled_back_groups: int = 0  # groups consumed before the kill and again after the restart's rollback
    instances_readmitted: int = 0  # SGS instances back in service after they were lost (the orchestrator's count)


def _learner_pid(run_dir: Path) -> int | None:
    path = run_dir / "learner.pid"
    return int(path.read_text()) if path.exists() else None


def _processes(run_dir: Path, component: str) -> list[psutil.Process]:
    if component == "learner":
        pid = _learner_pid(run_dir)
        return [psutil.Process(pid)] if pid is not None and psutil.pid_exists(pid) else []
    module, args = COMPONENTS[component]
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if cmd[1:3] != ["-m", module] or str(run_dir) not in " ".join(cmd):
            continue
        if args and not any(cmd[i:i + 2] == args for i in range(len(cmd) - 1)):
            continue
        if component == "trainer" and ("--attempt" in cmd or proc.pid == _learner_pid(run_dir)):
            continue  # the original trainer (not a restarted one), not its learner process
        found.append(proc)
    return found


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    # complete lines only: a row being written (or its writer stopped by _freeze mid-line) is not yet a row
    return [json.loads(x) for x in path.read_text().split("\n")[:-1] if x.strip()]


class Injector:
    """``on_poll`` hook: injects the scenario's faults once the run is far enough, and bounds the run's time."""

    def __init__(self, scenario: Scenario, run_dir: Path, proxy, timeout_s: float) -> None:
        self.s = scenario
        self.run_dir = run_dir
        self.proxy = proxy
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.fault_at: float | None = None
        self.steps_before: int | None = None
        self.done: list[str] = []
        self.heal_at: float | None = None

    def _ready(self, rows: list[dict]) -> bool:
        if len(rows) < self.s.kill_after:
            return False
        if "trainer" in self.s.kill or "learner" in self.s.kill:
            from services.run import recovery

            found = recovery.newest(recovery.recovery_dir(self.run_dir))
            # a step past the newest checkpoint, none due with it: the kill lands between two. The trainer
            # process then rolls back the steps since (rollback exercised); the learner alone must lose none
            version = rows[-1]["weight_version"]
            return found is not None and version > found.version and version % EVERY != 0
        return True

    def __call__(self) -> None:
        if time.monotonic() > self.deadline:
            raise TimeoutError(f"chaos run {self.s.name} did not finish within {self.timeout_s:.0f}s")
        if self.heal_at is not None and time.time() >= self.heal_at:
            from services.common.faultproxy import Faults

            self.proxy.set(Faults())
            self.heal_at = None
        if (self.fault_at is not None or not (self.s.kill or self.s.fault in ("partition", "reset"))
                or not self._ready(_rows(self.run_dir))):
            return
        procs = {c: _processes(self.run_dir, c) for c in self.s.kill}
        missing = [c for c, ps in procs.items() if not ps]
        if missing:
            raise RuntimeError(f"chaos run {self.s.name}: no process for {missing} in {self.run_dir}")
        frozen = _freeze(procs)
        # decided again with the processes stopped: between the check above and the kill a step could finish
        # and its checkpoint land (make test-long saw a kill after step 6, a checkpoint step), so the decision,
        # the step count and the kill all see one state
        rows = _rows(self.run_dir)
        if not self._ready(rows):
            _thaw(frozen)
            return
        self.fault_at = time.time()
        self.steps_before = len(rows)
        for component, ps in procs.items():
            for p in ps:
                p.kill()
            self.done.append(f"kill:{component}")
        _thaw(frozen)  # the children not killed (the learner of a killed trainer) go on to notice and exit
        self._network_fault()

    def _network_fault(self) -> None:
        from services.common.faultproxy import Faults

        if self.s.fault == "partition":  # held 3 s, then healed (a delay is on the link from the start)
            self.proxy.set(Faults(blackhole=True))
            self.heal_at = time.time() + 3.0
        elif self.s.fault == "reset":  # every connection on the link, at once
            self.proxy.reset_all()
        if self.s.fault in ("partition", "reset"):
            self.done.append(f"net:{self.s.fault}")


def _freeze(procs: dict[str, list[psutil.Process]]) -> list[psutil.Process]:
    """SIGSTOP every process to be killed and its children (the trainer's learner), so no step finishes."""
    frozen = []
    for ps in procs.values():
        for p in ps:
            for q in [p, *p.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    q.suspend()
                    frozen.append(q)
    return frozen


def _thaw(frozen: list[psutil.Process]) -> None:
    for q in frozen:
        with contextlib.suppress(psutil.NoSuchProcess):
            q.resume()


def recovery_seconds(rows: list[dict], fault_at: float | None) -> float | None:
    """From the fault to the end of the first training step that finished after it."""
    if fault_at is None:
        return None
    after = [r["t_end"] for r in rows if r["t_end"] > fault_at]
    return min(after) - fault_at if after else None


def staleness_violations(rows: list[dict], bound: int) -> int:
    """Rows whose consumed samples broke the staleness bound (``bound_violations`` where the mode counts them)."""
    return sum(int(r["bound_violations"]) if "bound_violations" in r else int(r["staleness_max"] > bound) for r in rows)


def weights_check(sup, run_dir: Path, fronted: dict[str, str]) -> dict:
    """Every live relay's copy of the newest version has the same digest, and every SGS instance
    the trainer still uses serves that version (it checked the digest when it pulled). A relay
    restarted after the last push may not hold it (``relays_without_newest``: no instance it
    serves is left behind, or the instance check fails). ``fronted``: SGS address -> the proxy
    address the trainer dials instead."""
    from services.generation.client import GenerationClient
    from services.weights.client import RelayClient

    live = {s.name for s in sup.services if s.proc.poll() is None}
    rows = _rows(run_dir)
    # by the address the trainer dials (the orchestrator reports instances_alive): instances it lost for good are
    # left out
    alive = rows[-1].get("instances_alive") if rows else None
    routed = (run_dir / "router.port").exists()
    relays = {}
    for name in sorted(n for n in live if n.startswith("relay-")):
        client = RelayClient(f"127.0.0.1:{(run_dir / f'{name}.port').read_text().split()[0]}")
        try:
            relays[name] = client.versions()
        finally:
            client.close()
    versions = {}
    for name in sorted(n for n in live if n.startswith("sgs-")):
        address = f"127.0.0.1:{(run_dir / f'{name}.port').read_text().strip()}"
        # behind the router the trainer knows the router only: every live instance is checked
        if alive is not None and not alive.get(fronted.get(address, address), routed):
            continue
        client = GenerationClient(address)
        try:
            versions[name] = client.health().weight_version
        finally:
            client.close()
    newest = max((v for info in relays.values() for v in info.held), default=max(versions.values(), default=-1))
    digests = {n: info.versions[newest].digest for n, info in relays.items() if newest in info.held}
    ok = len(set(digests.values())) <= 1 and set(versions.values()) == {newest}
    return {"ok": ok, "version": newest, "relay_digests": digests, "instance_versions": versions,
            "relays_without_newest": sorted(set(relays) - set(digests))}


def restarts_by_service(run_dir: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for file in ("restarts.jsonl", "services.jsonl"):
        path = run_dir / "recovery" / file
        for line in path.read_text().splitlines() if path.exists() else []:
            name = json.loads(line)["service"]
            counts[name] = counts.get(name, 0) + 1
    return counts


# each engine step waits STEP_DELAY_MS so that the run's training phase lasts seconds, not a
# fraction of one: the faults land while samples are in flight
STEP_DELAY_MS = 15
EVERY = 3  # recovery checkpoint interval: two steps between checkpoints for a kill to land in
TWO = f"generation.step_delay_ms=[{STEP_DELAY_MS}, {STEP_DELAY_MS}]"
CONFIGS = {
    "bounded": ["trainer.mode=bounded", "trainer.eta=2", "generation.instances=3", "weights.transport=relay",
                "weights.relays=2", "trainer.repack.enabled=true", "trainer.repack.interval_s=0.2",
                f"generation.step_delay_ms=[{STEP_DELAY_MS}, {STEP_DELAY_MS}, {STEP_DELAY_MS}]"],
    "routed": ["trainer.mode=one_step", "generation.instances=2", 'generation.dispatch.router="on"',
               TWO],
    # deltas on, no shared memory (each instance pulls over the network, as from a relay on another host)
    "bounded_delta": ["trainer.mode=bounded", "trainer.eta=2", "generation.instances=3", "weights.transport=relay",
                      "weights.relays=2", "weights.delta=true", "weights.shm=false",
                      f"generation.step_delay_ms=[{STEP_DELAY_MS}, {STEP_DELAY_MS}, {STEP_DELAY_MS}]"],
    # one per mode, no router (the orchestrator's own membership): a lost instance must come back in each
    "sequential": ["trainer.mode=sequential", "generation.instances=2", 'generation.dispatch.router="off"', TWO],
    "sync": ["trainer.mode=sync", "generation.instances=2", 'generation.dispatch.router="off"', TWO],
    "one_step": ["trainer.mode=one_step", "generation.instances=2", 'generation.dispatch.router="off"', TWO],
    "agentic": ["trainer.mode=one_step", "generation.instances=2", TWO, "agentic.enabled=true",
                "agentic.concurrency=16", "agentic.max_turns=4", "agentic.latency.kind=fixed",
                "agentic.latency.mean_s=0.05",
                "trainer.prompts_per_iteration=2", "trainer.group_size=4", "trainer.micro_batch_groups=1"],
}


def run_scenario(s: Scenario, work: Path, checkpoint: str, base_config: Path, iterations: int,
                 timeout_s: float) -> RunResult:
    """Run ``s`` in ``work/<name>`` and check it (never raises for a failed run: ``error`` says why)."""
    from flows.launcher import run_processes
    from services.common.config import load_config, write_config
    from services.common.faultproxy import FaultProxy, Faults
    from services.run.ledger import check_ledger

    run_dir = work / s.name
    run_dir.mkdir(parents=True)
    cfg = load_config(base_config, [
        "generation.engine=hf", f"trainer.iterations={iterations}", f"trainer.recovery.every={EVERY}",
        "trainer.recovery.max_restarts=3", "eval.prompts=8", "weights.digest=sha256", *CONFIGS[s.config]])
    write_config(cfg, run_dir / "config.json")
    (run_dir / "metrics.jsonl").write_text("")
    result = RunResult(s.name, samples_expected=iterations * cfg.trainer.prompts_per_iteration * cfg.trainer.group_size,
                       config=s.config)
    inject = Injector(s, run_dir, None, timeout_s)
    fronted: dict[str, str] = {}  # SGS address -> the proxy's

    def front(address: str) -> str:  # the trainer reaches the first SGS (or the router) through a proxy
        if not s.fault or inject.proxy is not None:
            return address
        inject.proxy = FaultProxy(address).start()
        if s.fault == "delay":
            inject.proxy.set(Faults(delay_ms=20, jitter_ms=20))
        fronted[address] = inject.proxy.address
        return inject.proxy.address

    t0 = time.time()
    try:
        run_processes(run_dir, checkpoint, on_poll=inject, poll_s=0.2,
                      on_finish=lambda sup: result.weights.update(weights_check(sup, run_dir, fronted)), front=front)
        summary = json.loads((run_dir / "summary.json").read_text())
        result.completed = summary["final_weight_version"] == iterations
        result.rl_seconds = summary.get("rl_seconds")
    except Exception as err:  # noqa: BLE001 - the run failed: recorded, the suite goes on
        result.error = f"{type(err).__name__}: {str(err)[-2000:]}"
    finally:
        if inject.proxy is not None:
            inject.proxy.stop()
    result.wall_s = time.time() - t0
    # on the link all along
    result.faults = inject.done + (["net:delay"] if s.fault == "delay" and inject.proxy is not None else [])
    result.fault_at = inject.fault_at
    result.steps_before_fault = inject.steps_before
    rows = _rows(run_dir)
    result.recovery_s = recovery_seconds(rows, inject.fault_at)
    result.restarts = restarts_by_service(run_dir)
    result.violations = staleness_violations(rows, cfg.trainer.eta if s.config == "bounded" else 1)
    rolled_back = 0
    if (run_dir / "ledger.jsonl").exists():
        report = check_ledger(run_dir / "ledger.jsonl", iterations, cfg.trainer.prompts_per_iteration)
        result.ledger = report.to_json()
        result.duplicates = len(report.duplicate_samples)
        result.samples_lost = max(0, result.samples_expected - report.consumed_samples)
        rolled_back = result.rolled_back_groups = report.rolled_back_groups
    else:
        result.samples_lost = result.samples_expected
    revivals = run_dir / "learner-restarts.jsonl"
    result.learner_revivals = [json.loads(x) for x in revivals.read_text().splitlines()] if revivals.exists() else []
    last = rows[-1] if rows else {}
    if cfg.weights.delta:  # versions sent and taken as deltas, whole, and whole after a missing base
        result.weights["deltas"] = {k: v for k, v in last.items() if k.startswith("weights_")}
    result.trajectories_lost = (rolled_back + int(last.get("regenerated_after_restart", 0))) * cfg.trainer.group_size
    result.instances_readmitted = int(last.get("instances_readmitted", 0))
    return result
