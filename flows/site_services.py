"""Per-site service flows: the processes one site runs for one RL run.

``generation_site`` starts the site's SGS instances bound to the site config's host and port
(``sgs_port + i`` for instance i; 0 = any free port) and, when the run routes, their router at
``router_port``; publishes what the training site dials (the router, or the instances) as the
flow-run input ``sgs-endpoints`` (read by the controller) and as a table artifact (read by
people), then serves until told to stop. With ``unit`` k >= 1 it is a scale-out unit instead:
one more SGS instance, started by the controller's scale-out and taken in by the router.
With ``tls.enabled`` whatever faces the other sites serves mutual TLS. ``training_site``
starts the trainer against the SGS addresses it is given and finishes when the trainer does.
Both supervise their processes with ``flows.processes.Supervisor``: a dead process fails the
site's flow run with its log tail, which the controller (``flows/two_site.py``) reports.

A site stops its services when the controller writes the flow-run input ``stop`` to it, or when
the controller's own flow run has reached a final state (crashed, cancelled), so a lost
controller never leaves servers behind. A generation site then ends Completed; a training site
stopped before its trainer finished ends Cancelled (the failure is reported by the site that
caused it). Prefect turns a SIGTERM (a cancelled run, a stopped
worker) into an exception, and the ``finally`` blocks stop the processes then too.

With the relay weight transport (``weights.transport: relay``, the default) each site also runs
one weight relay (``flows.processes.start_relay``): the training site's is the master the trainer
pushes to; a generation site's relay serves its SGS instances, which pull from it, and other
sites at ``relay_tls_port`` (mutual TLS when ``tls.enabled``). The generation site publishes its
relay as flow-run input ``relay-endpoint``, so the trainer's chain controller links master ->
site relay: one copy of every version crosses each site-to-site link (StreamRL §6).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

from prefect import flow, get_run_logger
from prefect.states import Cancelled, State
from pydantic import Field

from flows.processes import (
    Supervisor,
    instance_groups,
    instance_service,
    instances_per_process,
    router_enabled,
    start_env_workers,
    start_instances,
    start_relay,
    start_router,
    start_trainer,
    supervise_trainer,
)
from flows.reward_pool import RewardPoolController
from flows.two_site import ENDPOINTS_KEY, FINAL, INSTANCES_KEY, RELAY_KEY, STOP_KEY
from services.common.config import RunConfig, write_config
from services.common.sites import Role, SiteConfig, SitesConfig

POLL_S = 1.0


class StopSignal:
    """Polls the Prefect API: has the controller asked this site run to stop, or gone away?"""

    def __init__(self) -> None:
        from prefect.runtime import flow_run

        self.controller = flow_run.parent_flow_run_id  # None when the run was started by hand
        self.reason = ""

    def requested(self) -> bool:
        from prefect.client.orchestration import get_client
        from prefect.input import read_flow_run_input

        value = read_flow_run_input(STOP_KEY)
        if value is not None:
            self.reason = str(value.get("reason", value) if isinstance(value, dict) else value)
            return True
        if self.controller:
            with get_client(sync_client=True) as client:
                state = client.read_flow_run(self.controller).state
            if state is not None and state.type.value in FINAL:
                self.reason = f"the controller flow run ended {state.type.value}"
                return True
        return False


def _site(sites: SitesConfig, name: str, role: Role, config: RunConfig, run_dir: str) -> tuple[SiteConfig, Path, Path]:
    site = sites.site(name)
    if role not in site.roles:
        raise ValueError(f"site {name!r} has roles {site.roles}; it cannot run the {role} service flow")
    rd = Path(run_dir)
    rd.mkdir(parents=True, exist_ok=True)
    cfg_path = rd / f"config-{site.name}.json"  # the site's own copy of the resolved run config
    write_config(config, cfg_path)
    return site, rd, cfg_path


@flow(name="generation_site", log_prints=True)
def generation_site(
    site: str, sites: SitesConfig, config: RunConfig, checkpoint: str, run_dir: str,
    unit: Annotated[int, Field(ge=0, le=1024)] = 0, relay: str = "",
) -> dict:
    """Serve the SGS instances of one generation site until the controller says stop.

    Args:
        site: Name of this site in the site config.
        sites: The site config (hosts, ports, work pools of every site).
        config: The resolved run config.
        checkpoint: Warm-start checkpoint directory (a path this site can read).
        run_dir: Run directory for this site's logs.
        unit: 0: the site's run (its relay, its instances and, when the run routes, their router).
            k >= 1: scale-out unit k, started by the controller: one more SGS instance
            (index generation.instances + k - 1) that the router takes in.
        relay: For a unit under the relay transport: the site relay's address to pull weights from.
    """
    from prefect.artifacts import create_table_artifact
    from prefect.input import create_flow_run_input

    logger = get_run_logger()
    s, rd, cfg_path = _site(sites, site, "generation", config, run_dir)
    sup = Supervisor(rd, config.trainer.recovery.max_restarts)  # a dead relay or router is started again
    stop = StopSignal()
    try:
        rows = _serve_unit(sup, rd, s, config, checkpoint, cfg_path, unit, relay) if unit else \
            _serve_site(sup, rd, s, sites, config, checkpoint, cfg_path)
        endpoints = [r["address"] for r in rows if r["role"] != "instance"]  # what the trainer or the router dials
        create_flow_run_input(ENDPOINTS_KEY, endpoints)
        create_table_artifact(rows, key="sgs-endpoints",
                              description=f"SGS of site {s.name}" + (f", unit {unit}" if unit else ""))
        logger.info("site %s serves SGS at %s", s.name, ", ".join(endpoints))
        while not stop.requested():
            sup.check()
            time.sleep(POLL_S)
        logger.info("stopping: %s", stop.reason)
    finally:
        sup.stop_all()
    return {"site": s.name, "unit": unit, "sgs": endpoints}


def _serve_site(
    sup: Supervisor, rd: Path, s: SiteConfig, sites: SitesConfig, config: RunConfig, checkpoint: str, cfg_path: Path
) -> list[dict]:
    """Start the site's relay, instances and (when the run routes) router; publish the relay and
    the instances; return the endpoint table (the router, or the instances, face the other sites)."""
    from prefect.input import create_flow_run_input

    tls = (sites.tls.dir, s.name) if sites.tls.enabled else None
    routed = router_enabled(config)
    relay = _site_relay(sup, rd, s, sites, config) if config.weights.transport == "relay" else None
    per_process = instances_per_process(config.generation)  # several per process: the emulated engine only
    instances = start_instances(
        sup, rd, checkpoint, config.generation.instances, config.generation.threads,
        tolerate_exit=config.generation.instances > 1,
        host=s.host, base_port=s.sgs_port, config=cfg_path, relays=[relay[0]] if relay else None,
        tls=None if routed else tls,  # behind the router, instances are reached from this site only
        per_process=per_process,
    )
    role = "instance" if routed else "front"
    groups = instance_groups(0, len(instances), per_process)
    rows = [{"role": role, "address": a, "log": str(rd / f"{instance_service(i, groups)}.log")}
            for i, a in enumerate(instances)]
    if routed:
        router = start_router(sup, rd, checkpoint, instances, host=s.host, port=s.router_port, config=cfg_path, tls=tls,
                              restartable=not config.scaleout.enabled)
        rows.insert(0, {"role": "router", "address": router, "log": str(rd / "router.log")})
    if relay is not None:
        create_flow_run_input(RELAY_KEY, relay[1])
    create_flow_run_input(INSTANCES_KEY, instances)
    return rows


def _serve_unit(
    sup: Supervisor, rd: Path, s: SiteConfig, config: RunConfig, checkpoint: str, cfg_path: Path, unit: int, relay: str
) -> list[dict]:
    """Start scale-out unit ``unit``: one SGS instance on this site, for its router (plaintext, in-site)."""
    if config.weights.transport == "relay" and not relay:
        raise ValueError(f"unit {unit}: the relay weight transport needs the site relay's address (parameter relay)")
    index = config.generation.instances + unit - 1
    (address,) = start_instances(
        sup, rd, checkpoint, 1, config.generation.threads, host=s.host, base_port=s.sgs_port, config=cfg_path,
        relays=[relay] if relay else None, first=index, cpus=config.scaleout.cpus or None,
    )
    return [{"role": "unit", "address": address, "log": str(rd / f"sgs-{index}.log")}]


def _site_relay(sup: Supervisor, rd: Path, s: SiteConfig, sites: SitesConfig, config: RunConfig) -> tuple[str, str]:
    """Start this site's weight relay; return (its address on the site, its relay spec for the
    trainer: ``host:port@site``, plus ``@tls://host:tls_port`` where other sites reach it)."""
    w = config.weights
    tls_dir = sites.tls.dir if sites.tls.enabled else ""
    serve_tls = sites.tls.enabled and "training" not in s.roles  # the master only dials out
    address, tls_port = start_relay(
        sup, rd, f"relay-{s.name}", keep=w.keep_versions, shm=w.shm, max_message_mb=w.max_message_mb,
        host=s.host, port=s.relay_port, site=s.name, tls_dir=tls_dir, tls_port=s.relay_tls_port if serve_tls else None,
        data_path=w.data_path,
    )
    spec = f"{address}@{s.name}" + (f"@tls://{s.host}:{tls_port}" if tls_port is not None else "")
    return address, spec


@flow(name="training_site", log_prints=True)
def training_site(
    site: str, sites: SitesConfig, config: RunConfig, checkpoint: str, run_dir: str, sgs: list[str],
    relays: list[str] | None = None,
) -> dict | State:
    """Run the trainer of one RL run against the given SGS addresses until it finishes.

    Args:
        site: Name of this site in the site config.
        sites: The site config (hosts, ports, work pools of every site).
        config: The resolved run config.
        checkpoint: Warm-start checkpoint directory (a path this site can read).
        run_dir: Run directory: the trainer writes metrics, timeline and summary here.
        sgs: SGS addresses (host:port) published by the generation sites.
        relays: Relay specs published by the generation sites (relay weight transport).
    """
    logger = get_run_logger()
    if not sgs:
        raise ValueError("training_site needs at least one SGS address")
    s, rd, cfg_path = _site(sites, site, "training", config, run_dir)
    sup = Supervisor(rd, config.trainer.recovery.max_restarts)
    stop = StopSignal()
    try:
        links = []  # how the trainer reaches the weight relays and the SGS
        if config.weights.transport == "relay":
            master = _site_relay(sup, rd, s, sites, config)[1]
            links = ["--relays", ",".join([master, *(relays or [])])]
        if sites.tls.enabled:  # the SGS (or its router) and the other sites' relays are across the link
            links += ["--tls-dir", sites.tls.dir, "--sgs-tls"]
        rewards = None
        if config.agentic.enabled:  # environment workers beside the trainer (loopback)
            links += ["--env-workers", ",".join(start_env_workers(sup, rd, config.agentic.workers, config=cfg_path))]
        rewards = RewardPoolController(sup, rd, config, config=cfg_path)  # every run's rewards, beside the trainer
        rewards.start()
        links += ["--reward-membership", str(rewards.membership)]

        def tick() -> bool:
            rewards.poll()
            return stop.requested()

        def start(attempt: int, died_at: float | None):
            logger.info("site %s: trainer (attempt %d) started against %s", s.name, attempt, ", ".join(sgs))
            return start_trainer(
                sup, config,
                ["--config", str(cfg_path), "--model", checkpoint, "--sgs", ",".join(sgs), "--run-dir", str(rd),
                 "--training-site", s.name] + links
                + (["--attempt", str(attempt), "--died-at", repr(died_at)] if attempt else []),
            )

        # a dead trainer restarts and resumes (trainer.recovery); a stop request means the run is over
        # elsewhere (another site died): end Cancelled, not Failed
        if supervise_trainer(sup, start, config.trainer.recovery.max_restarts, tick, POLL_S) < 0:
            return Cancelled(message=f"site {s.name}: stopped before the trainer finished ({stop.reason})")
        sup.check()  # the other ranks' exits
    finally:
        if rewards is not None:
            rewards.close()
        sup.stop_all()
    return {"site": s.name, "summary": str(rd / "summary.json")}
