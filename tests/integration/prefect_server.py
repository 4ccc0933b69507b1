"""A real Prefect server for integration tests: `braid server start` on a free loopback port with
auth on, the deployments of deploy/prefect.yaml, one process worker per site pool, site services
on ports 0. Shared by the tests that drive deployments (through the REST API or the CLIs)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from flows.processes import free_port
from flows.server import ServerOptions, start, stop

ROOT = Path(__file__).resolve().parents[2]
SITES = ROOT / "deploy/sites/local-two-site.yaml"
AUTH = "braid:integration-test"


@contextmanager
def prefect_server(tmp: Path) -> Iterator[dict]:
    """The server's state (``flows.server.start``'s: ``api_url``, workers) while the block runs."""
    sites = yaml.safe_load(SITES.read_text())
    for site in sites["sites"]:
        site["sgs_port"] = site["router_port"] = site["relay_port"] = site["relay_tls_port"] = 0  # tests bind free ports
    (tmp / "sites.yaml").write_text(yaml.safe_dump(sites))
    saved = os.environ.get("PREFECT_SERVER_API_AUTH_STRING")
    os.environ["PREFECT_SERVER_API_AUTH_STRING"] = AUTH
    opts = ServerOptions(port=free_port(), sites_file=str(tmp / "sites.yaml"), state_dir=str(tmp / "state"), root=str(ROOT))
    try:
        yield start(opts)
    finally:
        stop(opts.state_dir)
        if saved is None:
            os.environ.pop("PREFECT_SERVER_API_AUTH_STRING", None)
        else:
            os.environ["PREFECT_SERVER_API_AUTH_STRING"] = saved
