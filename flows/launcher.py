"""Local launcher: every process of one run on this host, supervised until the trainer exits.

``run_processes`` starts the weight relays, the SGS instances (behind the router when the config
routes), the scale-out controller when enabled (``flows.scaleout``), the environment workers of an
agentic run, the reward pool (``flows.reward_pool``) and the trainer, through
``flows.processes``; used by the Prefect flow and by the benchmarks.
"""

from __future__ import annotations

import time
from pathlib import Path

from flows.processes import (
    Service,
    Supervisor,
    instance_groups,
    instance_service,
    instances_per_process,
    restartable_group,
    router_enabled,
    standby_instances,
    start_env_workers,
    start_instances,
    start_relays,
    start_router,
    start_trainer,
    supervise_trainer,
)
from flows.reward_pool import RewardPoolController
from flows.run_cpu import SteadyCpu, children_cpu_s, record_process_cpu


def run_processes(run_dir: Path, checkpoint: str, on_poll=None, poll_s: float = 0.5, *, on_finish=None,
                  front=None) -> Path:
    """Start the SGS instances and the trainer for the run in ``run_dir``, supervise them until the
    trainer finishes (a trainer that dies is restarted and resumes from its recovery checkpoint, up
    to ``trainer.recovery.max_restarts`` times), stop everything, and return the path of ``summary.json``.

    ``on_poll()`` is called every ``poll_s`` while the trainer runs (progress reporting);
    ``on_finish(sup)`` after the trainer finished, while the services still run (the chaos
    suite's checks); ``front(address)`` gives the address the trainer dials for each SGS (or
    router) address (the chaos suite's fault-injecting proxies)."""
    from flows.registries import check_registries
    from services.common.config import load_config

    cfg = check_registries(load_config(run_dir / "config.json"))  # benchmarks write config.json themselves
    cpu0, wall0 = children_cpu_s(), time.time()
    steady = SteadyCpu(run_dir / "metrics.jsonl")
    sup = Supervisor(run_dir, cfg.trainer.recovery.max_restarts)  # a dead relay or router is started again
    config = str(run_dir / "config.json")
    controller = None
    rewards = None
    try:
        # the rollout resumes a lost instance's trajectories (a multi-turn run re-runs their turns) and
        # readmits it once restarted, in every mode
        tolerate = cfg.generation.instances > 1
        # every run's rewards: worker processes, restarted on their ports; started first, so their
        # start-up overlaps the SGS instances' (awaited below)
        rewards = RewardPoolController(sup, run_dir, cfg)
        launched = rewards.launch()
        w = cfg.weights
        relays = (
            start_relays(sup, run_dir, w.relays, keep=w.keep_versions, shm=w.shm, max_message_mb=w.max_message_mb,
                         data_path=w.data_path)
            if w.transport == "relay" else []
        )
        per_process = instances_per_process(cfg.generation)  # several per process: the emulated engine only
        standby = standby_instances(cfg)  # the emulated scale-out pool, served idle beside the run's own
        started = start_instances(
            sup, run_dir, checkpoint, cfg.generation.instances + standby, cfg.generation.threads,
            tolerate_exit=tolerate, relays=relays, per_process=per_process,
        )
        addresses, pool = started[:cfg.generation.instances], started[cfg.generation.instances:]
        groups = instance_groups(0, len(started), per_process)
        routed = router_enabled(cfg)
        # a dead process is started again with its instances on their ports (behind the router too: it
        # dials the same addresses again; under scale-out the router's membership replaces instances instead)
        if not (routed and cfg.scaleout.enabled):
            def start_group(first: int, ports: list[int]) -> None:
                start_instances(sup, run_dir, checkpoint, len(ports), cfg.generation.threads, tolerate_exit=tolerate,
                                relays=relays, first=first, ports=ports, per_process=len(ports))

            for group in groups:
                restartable_group(sup, group.start, [int(started[i].rsplit(":", 1)[1]) for i in group], start_group)
        router = (start_router(sup, run_dir, checkpoint, addresses, restartable=not cfg.scaleout.enabled)
                  if routed else None)
        if cfg.scaleout.enabled:  # dynamic DP scale-out of the SGS (flows/scaleout.py)
            from flows.scaleout import FileMembership, ProcessUnits, ScaleoutController, StandbyUnits

            if standby:  # the emulated engine: added instances come from the standby pool, removed ones go back
                members = [(a, a) for a in addresses]
                units = StandbyUnits(pool, cfg.scaleout.emulated_start_s * cfg.generation.emulation.time_scale)
            else:
                by_name = {svc.name: svc for svc in sup.services}
                # all of them may leave (a process serving several stops when the last of them has left)
                members = [(a, by_name[instance_service(i, groups)]) for i, a in enumerate(addresses)]
                units = ProcessUnits(sup, run_dir, cfg, checkpoint, relays, members)
            # through the router when there is one, else the trainer's orchestrator (its membership file)
            membership = router if routed else FileMembership(run_dir, addresses)
            controller = ScaleoutController(run_dir, cfg, membership, addresses, units, members)
        if routed:  # the trainer talks to the router only; it dispatches and merges
            addresses = [router]
        fronts = [(addresses[0], None)] if routed else \
            [(a, instance_service(i, groups)) for i, a in enumerate(addresses)]
        if front is not None:
            fronts = [(front(a), name) for a, name in fronts]
        base = ["--config", config, "--model", checkpoint, "--run-dir", str(run_dir)]
        if cfg.agentic.enabled:  # environment workers: processes, restarted on their ports
            base += ["--env-workers", ",".join(start_env_workers(sup, run_dir, cfg.agentic.workers))]
        rewards.start(launched)
        base += ["--reward-membership", str(rewards.membership)]
        start = _trainer_starter(sup, cfg, base + (["--relays", ",".join(relays)] if relays else []), fronts)

        def tick() -> bool:
            steady.poll(sup.services)
            if controller is not None:
                controller.poll()
            if rewards is not None:
                rewards.poll()  # grows and shrinks the reward pool (reward.scaling)
            if on_poll is not None:
                on_poll()
            return False

        supervise_trainer(sup, start, cfg.trainer.recovery.max_restarts, tick, poll_s)
        sup.check()  # the other ranks' exits
        if controller is not None:
            controller.poll()  # the last iterations' decisions, for the record
        if on_finish is not None:
            on_finish(sup)
    finally:
        if controller is not None:
            controller.close()
        if rewards is not None:
            rewards.close()
        sup.stop_all()
    record_process_cpu(run_dir / "summary.json", children_cpu_s() - cpu0, time.time() - wall0, steady)
    return run_dir / "summary.json"


def dialled(sup: Supervisor, fronts: list[tuple[str, str | None]]) -> list[str]:
    """The addresses of ``fronts`` a (re)started trainer dials: those whose instance runs, or is
    dead but about to be started again on its port by the supervisor (the trainer waits for it)."""

    def running(name: str | None) -> bool:
        svc = next((s for s in reversed(sup.services) if s.name == name), None)
        if name is None or (svc is not None and svc.proc.poll() is None):
            return True
        return svc is not None and svc.restart is not None and sup.restarts.get(name, 0) < sup.max_restarts

    return [a for a, name in fronts if running(name)]


def _trainer_starter(sup: Supervisor, cfg, args: list[str], fronts: list[tuple[str, str | None]]):
    """``start(attempt, died_at)`` for ``supervise_trainer``: the trainer with ``args``, the SGS
    addresses of ``fronts`` (address, its instance's service name or None) whose process runs now
    or will run again (a restarted instance's new one counts, and so does a dead one the supervisor
    is about to start again on its port: the trainer waits for it; one given up for good stays
    out), and on a restart its attempt and when the last one died."""

    def start(attempt: int, died_at: float | None) -> Service:
        live = dialled(sup, fronts)
        restart = ["--attempt", str(attempt), "--died-at", repr(died_at)] if attempt else []
        return start_trainer(sup, cfg, [*args, "--sgs", ",".join(live), *restart])

    return start
