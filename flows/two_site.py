"""Two-site mode of ``rl_training``: the controller side.

Each site of the site config (``services/common/sites.py``) runs its services in its own Prefect
flow run, on a worker of the site's work pool: ``generation_site/<site>`` (SGS instances) and
``training_site/<site>`` (the trainer), both in ``flows/site_services.py``. The controller
(the ``rl_training`` flow run, on the training site's pool) wires them together through the
Prefect API only:

1. create one flow run per generation site from its deployment (a subflow of the controller);
2. wait until each is Running: a run that no worker picks up within ``start_timeout_s`` is
   cancelled and the controller fails naming the site's work pool (no worker polls it);
3. read each generation site's SGS addresses (``host:port`` from the site config), which the
   site publishes as flow-run input ``sgs-endpoints`` once its servers answer, and (relay weight
   transport) its relay spec, published before them as ``relay-endpoint``;
4. create the training site's flow run with those addresses; the trainer connects over gRPC and
   its chain controller links the master relay to every generation site's relay;
5. watch every site run (states polled each ``poll_s``): the training run Completed ends the
   run; any other site run reaching a final state first fails the controller with that run's
   state message (a dead service's log tail). With ``scaleout.enabled`` the scale-out
   controller (``flows.scaleout``) runs here too: an added SGS instance is a flow run of the
   generation site's deployment with ``unit`` k >= 1 (``PoolUnits``), watched like the others
   until a scale-in retires it;
6. always, last: send each site run still active the flow-run input ``stop`` and wait up to
   ``stop_timeout_s`` for it to stop its processes and finish.

The decisions (has a run waited too long, did one end too early) are pure functions over
``SiteObservation``; ``SiteRuns`` is the thin mechanism around the Prefect client.
For now both sites share this machine's filesystem: the warm-start checkpoint path and the run
directory are passed as parameters and must mean the same on every site.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

from pydantic import Field

from services.common.config import StrictModel, load_config
from services.common.sites import SiteConfig, SitesConfig, load_sites

ENDPOINTS_KEY = "sgs-endpoints"  # flow-run input a generation site writes: its SGS addresses
RELAY_KEY = "relay-endpoint"  # flow-run input a generation site writes (relay transport): its relay spec
INSTANCES_KEY = "sgs-instances"  # flow-run input a generation site writes: its SGS instances (behind its router)
STOP_KEY = "stop"  # flow-run input the controller writes to a site run: stop your services
GENERATION_FLOW = "generation_site"
TRAINING_FLOW = "training_site"
WAITING = frozenset({"SCHEDULED", "PENDING", "PAUSED"})  # created, not (yet) running on a worker
FINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "CRASHED"})


class TwoSiteConfig(StrictModel):
    """Two-site mode: the services run as per-site flow runs on the sites' work pools."""

    sites_file: str = Field(
        "deploy/sites/local-two-site.yaml", min_length=1,
        description="Site config (YAML, relative to the worker's working directory): sites, roles, hosts, "
        "ports and the work pool of each site.",
    )
    start_timeout_s: float = Field(
        120.0, ge=5.0, le=3600.0,
        description="How long a site's flow run may wait for a worker of its pool before the run fails "
        "naming the pool.",
    )
    ready_timeout_s: float = Field(
        300.0, ge=10.0, le=7200.0, description="How long a generation site may take to serve its SGS endpoints."
    )
    stop_timeout_s: float = Field(
        60.0, ge=5.0, le=3600.0, description="Grace for each site run to stop its processes at the end of the run."
    )
    poll_s: float = Field(1.0, ge=0.1, le=60.0, description="Seconds between polls of the site runs' states.")


class SiteFailed(RuntimeError):
    """A site's flow run did not start in time, or ended before the training finished."""


def deployment_name(flow_name: str, site: SiteConfig) -> str:
    """Deployments of site service flows are named after their site: ``<flow>/<site>``."""
    return f"{flow_name}/{site.name}"


@dataclass(frozen=True)
class SiteObservation:
    """One site run as the controller last saw it."""

    role: str  # "generation" | "training"
    site: str
    pool: str
    flow_run: str  # the flow run's name, as the UI shows it
    state: str  # Prefect state type: SCHEDULED, PENDING, RUNNING, COMPLETED, FAILED, ...
    message: str  # the state's message (a failed run's exception and log tail)
    waited_s: float  # seconds since the run was created


def not_started(obs: SiteObservation, timeout_s: float) -> str | None:
    """The failure message when ``obs`` is still waiting for a worker after ``timeout_s``."""
    if obs.state not in WAITING or obs.waited_s < timeout_s:
        return None
    if obs.state == "SCHEDULED":
        why = f"no worker of work pool {obs.pool!r} picked it up"
    else:
        why = f"a worker of work pool {obs.pool!r} took it but it did not start ({obs.state})"
    return (
        f"{obs.role} site {obs.site!r}: flow run {obs.flow_run!r} waited {obs.waited_s:.0f}s (limit {timeout_s:.0f}s); "
        f"{why}. Is a worker running for pool {obs.pool!r}? Start one with: "
        f"prefect worker start --pool {obs.pool} --type process"
    )


def ended_early(obs: SiteObservation) -> str | None:
    """The failure message when a site run reached a final state while the run still needs it.
    (The training run Completed is the one expected end; the caller checks for it first.)"""
    if obs.state not in FINAL:
        return None
    return f"{obs.role} site {obs.site!r}: flow run {obs.flow_run!r} ended {obs.state}: {obs.message or '(no message)'}"


def verdict(observations: list[SiteObservation], start_timeout_s: float) -> str | None:
    """The first failure among the site runs, or None while all of them are fine."""
    for obs in observations:
        message = ended_early(obs) or not_started(obs, start_timeout_s)
        if message:
            return message
    return None


@dataclass
class SiteRun:
    role: str
    site: SiteConfig
    id: UUID
    name: str
    created: float


class SiteRuns:
    """Creates, observes and stops the site flow runs of one controller run (the mechanism)."""

    def __init__(self, params: TwoSiteConfig) -> None:
        from prefect.client.orchestration import get_client

        self.params = params
        self._client_context = get_client(sync_client=True)
        self.client = self._client_context.__enter__()
        self._lock = threading.RLock()  # the client is shared with the scale-out thread (flows.scaleout)
        self.runs: list[SiteRun] = []
        self.retired: list[SiteRun] = []  # stopped on purpose (a scale-in): their end is not a failure

    def start(self, role: str, flow_name: str, site: SiteConfig, parameters: dict) -> SiteRun:
        from prefect.deployments import run_deployment
        from prefect.exceptions import ObjectNotFound

        name = deployment_name(flow_name, site)
        try:
            fr = run_deployment(name, parameters=parameters, timeout=0, as_subflow=True)
        except ObjectNotFound:
            raise SiteFailed(
                f"{role} site {site.name!r}: the server has no deployment {name!r} "
                "(deploy/prefect.yaml needs one per site)"
            ) from None
        run = SiteRun(role, site, fr.id, fr.name, time.monotonic())
        with self._lock:
            self.runs.append(run)
        return run

    def observe(self, run: SiteRun) -> SiteObservation:
        with self._lock:
            fr = self.client.read_flow_run(run.id)
        state = fr.state
        return SiteObservation(
            role=run.role, site=run.site.name, pool=run.site.work_pool, flow_run=run.name,
            state=state.type.value if state else "SCHEDULED", message=(state.message or "") if state else "",
            waited_s=time.monotonic() - run.created,
        )

    def check(self, expect_done: SiteRun | None = None) -> bool:
        """Raise ``SiteFailed`` on a failure verdict; True when ``expect_done`` Completed."""
        with self._lock:
            runs = [r for r in self.runs if r not in self.retired]
        observations = [self.observe(r) for r in runs]
        for run, obs in zip(runs, observations, strict=True):
            if run is expect_done and obs.state == "COMPLETED":
                return True
        message = verdict(observations, self.params.start_timeout_s)
        if message:
            self._cancel_waiting(runs, observations, f"cancelled by the controller: {message}")
            raise SiteFailed(message)
        return False

    def retire(self, run: SiteRun, reason: str) -> None:
        """Ask one site run to stop its services; its end is then no longer a failure."""
        from prefect.input import create_flow_run_input

        with self._lock:
            self.retired.append(run)
        create_flow_run_input(STOP_KEY, {"reason": reason}, flow_run_id=run.id)

    def wait_running(self, run: SiteRun) -> None:
        while self.observe(run).state in WAITING:
            self.check()
            time.sleep(self.params.poll_s)

    def wait_endpoints(self, run: SiteRun) -> list[str]:
        from prefect.input import read_flow_run_input

        deadline = time.monotonic() + self.params.ready_timeout_s
        while True:
            self.check()
            value = read_flow_run_input(ENDPOINTS_KEY, flow_run_id=run.id)
            if value:
                return [str(a) for a in value]
            if time.monotonic() > deadline:
                raise SiteFailed(
                    f"generation site {run.site.name!r}: flow run {run.name!r} published no SGS endpoints within "
                    f"{self.params.ready_timeout_s:.0f}s"
                )
            time.sleep(self.params.poll_s)

    def relay_of(self, run: SiteRun) -> list[str]:
        """The relay spec a generation site published (before its endpoints), or [] if none."""
        return self.published(run, RELAY_KEY)

    def published(self, run: SiteRun, key: str) -> list[str]:
        """What a site run published under ``key`` (before its endpoints), as a list; [] if nothing."""
        from prefect.input import read_flow_run_input

        value = read_flow_run_input(key, flow_run_id=run.id)
        if not value:
            return []
        return [str(a) for a in value] if isinstance(value, list) else [str(value)]

    def stop_all(self) -> list[SiteObservation]:
        """Ask every active site run to stop; wait for all to reach a final state (bounded)."""
        from prefect.input import create_flow_run_input

        with self._lock:
            runs = list(self.runs)
        for run in runs:
            if run not in self.retired and self.observe(run).state not in FINAL:
                create_flow_run_input(STOP_KEY, {"reason": "the controller is finishing"}, flow_run_id=run.id)
        deadline = time.monotonic() + self.params.stop_timeout_s
        while True:
            observations = [self.observe(r) for r in runs]
            if all(o.state in FINAL or o.state == "SCHEDULED" for o in observations) or time.monotonic() > deadline:
                self._cancel_waiting(runs, observations,
                                     "cancelled by the controller: the run ended before a worker took it")
                return observations
            time.sleep(self.params.poll_s)

    def _cancel_waiting(self, runs: list[SiteRun], observations: list[SiteObservation], reason: str) -> None:
        """Cancel runs no worker has taken, so a worker that comes up later does not start them."""
        from prefect.states import Cancelled

        for run, obs in zip(runs, observations, strict=True):
            if obs.state == "SCHEDULED":
                with self._lock:
                    self.client.set_flow_run_state(run.id, Cancelled(message=reason), force=True)

    def close(self) -> None:
        self._client_context.__exit__(None, None, None)


def site_parameters(run_dir: Path, checkpoint: str, sites: SitesConfig, site: SiteConfig) -> dict:
    """What every site flow gets: its site, the site config, the resolved run config, and paths."""
    cfg = load_config(run_dir / "config.json")
    return {
        "site": site.name, "sites": sites.model_dump(mode="json"), "config": cfg.model_dump(mode="json"),
        "checkpoint": checkpoint, "run_dir": str(run_dir),
    }


class PoolUnits:
    """Scale-out units of a generation site: each added SGS instance is a flow run of the site's
    ``generation_site`` deployment with ``unit`` k >= 1, picked up by a worker of the site's work
    pool (on a real site, any machine of its pool), watched like the site's other runs; a unit
    removed by scale-in is retired: told to stop, its end no longer a failure."""

    def __init__(self, runs: SiteRuns, site: SiteConfig, parameters: dict, first_index: int, relay: str) -> None:
        self.runs, self.site, self.parameters, self.first_index, self.relay = runs, site, parameters, first_index, relay

    def start(self, index: int) -> tuple[str, object, dict]:
        unit = index - self.first_index + 1
        run = self.runs.start("generation", GENERATION_FLOW, self.site,
                              {**self.parameters, "unit": unit, "relay": self.relay})
        self.runs.wait_running(run)
        (address,) = self.runs.wait_endpoints(run)
        return address, run, {"site": self.site.name, "flow_run": run.name, "unit": unit}

    def stop(self, handle: object) -> None:
        self.runs.retire(handle, "scale-in: the router no longer routes to this instance")


def site_scaleout(runs: SiteRuns, run_dir: Path, checkpoint: str, sites: SitesConfig, gen: SiteRun, router: str):
    """The scale-out controller of a two-site run: units on ``gen``'s site, through its router."""
    from flows.scaleout import ScaleoutController
    from services.common.certs import site_files

    cfg = load_config(run_dir / "config.json")
    instances = runs.published(gen, INSTANCES_KEY)
    relay = runs.relay_of(gen)
    units = PoolUnits(runs, gen.site, site_parameters(run_dir, checkpoint, sites, gen.site), len(instances),
                      relay[0].split("@")[0] if relay else "")
    # the controller sits on the training site: the router is across the link
    tls = site_files(sites.tls.dir, sites.training_site.name) if sites.tls.enabled else None
    return ScaleoutController(run_dir, cfg, router, instances, units, members=[], tls=tls)


def run_two_sites(
    run_dir: Path, checkpoint: str, params: TwoSiteConfig, on_poll: Callable[[], None] | None = None
) -> Path:
    """Run the services of the run in ``run_dir`` as per-site flow runs; return summary.json's path."""
    from prefect import get_run_logger

    logger = get_run_logger()
    sites = load_sites(params.sites_file)
    scaleout = load_config(run_dir / "config.json").scaleout.enabled
    if scaleout and len(sites.generation_sites) != 1:
        raise SiteFailed(
            f"scale-out in two-site mode adds instances behind one generation site's router; {params.sites_file} has "
            f"{len(sites.generation_sites)} generation sites ({[s.name for s in sites.generation_sites]})"
        )
    runs = SiteRuns(params)
    controller = None
    try:
        gens = [
            runs.start("generation", GENERATION_FLOW, s, site_parameters(run_dir, checkpoint, sites, s))
            for s in sites.generation_sites
        ]
        addresses: list[str] = []
        relays: list[str] = []
        for run in gens:
            runs.wait_running(run)
            addresses += runs.wait_endpoints(run)
            relays += runs.relay_of(run)
            logger.info("generation site %s (flow run %s) serves %s", run.site.name, run.name, addresses)
        train_site = sites.training_site
        train = runs.start(
            "training", TRAINING_FLOW, train_site,
            {**site_parameters(run_dir, checkpoint, sites, train_site), "sgs": addresses, "relays": relays},
        )
        runs.wait_running(train)
        logger.info("training site %s (flow run %s) is running", train_site.name, train.name)
        if scaleout:  # the generation site's endpoint is its router
            controller = site_scaleout(runs, run_dir, checkpoint, sites, gens[0], addresses[0])
        while not runs.check(expect_done=train):
            if controller is not None:
                controller.poll()
            if on_poll is not None:
                on_poll()
            time.sleep(params.poll_s)
        if controller is not None:
            controller.poll()  # the last iterations' decisions, for the record
    finally:
        if controller is not None:
            controller.close()
        final = runs.stop_all()
        runs.close()
    bad = [o for o in final if o.state not in ("COMPLETED", "SCHEDULED")]  # SCHEDULED: a unit no worker took in time
    if bad:
        raise SiteFailed("; ".join(f"{o.role} site {o.site!r} ended {o.state}: {o.message}" for o in bad))
    return run_dir / "summary.json"
