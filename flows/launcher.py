"""Local launcher: every process of one run on this host, supervised until the trainer exits.

``run_processes`` starts the weight relays, the SGS instances (behind the router when the config
routes), the scale-out controller when enabled (``flows.scaleout``), the environment workers of an
agentic run, the reward pool (``flows.reward_pool``) and the trainer, through
``flows.processes``; used by the Prefect flow and by the benchmarks.
"""

from __future__ import annotations

from pathlib import Path

from flows.processes import (
    Service,
    Supervisor,
    router_enabled,
    start_env_workers,
    start_instances,
    start_relays,
    start_router,
    start_trainer,
    supervise_trainer,
)
from flows.reward_pool import RewardPoolController


def run_processes(run_dir: Path, checkpoint: str, on_poll=None, poll_s: float = 0.5, *, on_finish=None,
                  front=None) -> Path:
    """Start the SGS instances and the trainer for the run in ``run_dir``, supervise them until the
    trainer finishes (a trainer that dies is restarted and resumes from its recovery checkpoint, up
    to ``trainer.recovery.max_restarts`` times), stop everything, and return the path of ``summary.json``.

    ``on_poll()`` is called every ``poll_s`` while the trainer runs (progress reporting);
    ``on_finish(sup)`` after the trainer finished, while the services still run (the chaos
    suite's checks); ``front(address)`` gives the address the trainer dials for each SGS (or
    router) address (the chaos suite's fault-injecting proxies)."""
    from services.common.config import load_config

    cfg = load_config(run_dir / "config.json")
    sup = Supervisor(run_dir, cfg.trainer.recovery.max_restarts)  # a dead relay or router is started again
    config = str(run_dir / "config.json")
    controller = None
    rewards = None
    try:
        # the bounded runner resumes a lost instance's trajectories (the agentic runner does not)
        tolerate = cfg.trainer.mode == "bounded" and cfg.generation.instances > 1 and not cfg.agentic.enabled
        w = cfg.weights
        relays = (
            start_relays(sup, run_dir, w.relays, keep=w.keep_versions, shm=w.shm, max_message_mb=w.max_message_mb,
                         data_path=w.data_path)
            if w.transport == "relay" else []
        )
        addresses = start_instances(
            sup, run_dir, checkpoint, cfg.generation.instances, cfg.generation.threads, tolerate_exit=tolerate,
            relays=relays,
        )
        routed = router_enabled(cfg)
        if routed:  # the trainer talks to the router only; it dispatches and merges
            router = start_router(sup, run_dir, checkpoint, addresses, restartable=not cfg.scaleout.enabled)
            if cfg.scaleout.enabled:  # dynamic DP scale-out of the SGS (flows/scaleout.py)
                from flows.scaleout import ProcessUnits, ScaleoutController

                by_name = {svc.name: svc for svc in sup.services}
                members = [(a, by_name[f"sgs-{i}"]) for i, a in enumerate(addresses)]  # all of them may leave
                units = ProcessUnits(sup, run_dir, cfg, checkpoint, relays)
                controller = ScaleoutController(run_dir, cfg, router, addresses, units, members)
            addresses = [router]
        by_name = {svc.name: svc for svc in sup.services}
        fronts = [(addresses[0], None)] if routed else [(a, by_name.get(f"sgs-{i}")) for i, a in enumerate(addresses)]
        if front is not None:
            fronts = [(front(a), svc) for a, svc in fronts]
        base = ["--config", config, "--model", checkpoint, "--run-dir", str(run_dir)]
        if cfg.agentic.enabled:  # environment workers: processes, restarted on their ports
            base += ["--env-workers", ",".join(start_env_workers(sup, run_dir, cfg.agentic.workers))]
        rewards = RewardPoolController(sup, run_dir, cfg)  # every run's rewards: worker processes, restarted on their ports
        rewards.start()
        base += ["--reward-membership", str(rewards.membership)]
        start = _trainer_starter(sup, cfg, base + (["--relays", ",".join(relays)] if relays else []), fronts)

        def tick() -> bool:
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
    return run_dir / "summary.json"


def _trainer_starter(sup: Supervisor, cfg, args: list[str], fronts: list[tuple[str, Service | None]]):
    """``start(attempt, died_at)`` for ``supervise_trainer``: the trainer with ``args``, the SGS
    addresses of ``fronts`` (address, its instance's process or None) still alive (a lost
    bounded-mode instance stays lost), and on a restart its attempt and when the last one died."""

    def start(attempt: int, died_at: float | None) -> Service:
        live = [a for a, svc in fronts if svc is None or svc.proc.poll() is None]
        restart = ["--attempt", str(attempt), "--died-at", repr(died_at)] if attempt else []
        return start_trainer(sup, cfg, [*args, "--sgs", ",".join(live), *restart])

    return start
