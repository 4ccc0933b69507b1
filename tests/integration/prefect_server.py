"""A real Prefect server for integration tests: `braid server start` on a free port with auth on,
the deployments of deploy/prefect.yaml, one process worker per site pool, site services on ports
0. Shared by the tests that drive deployments (through the REST API or the CLIs).

By default everything is on loopback. Given a ``ShapedLink`` (``bench/netns.py``), each site's
worker runs in that site's network namespace (training site: ``train``, generation site: ``gen``),
the sites' hosts are the link's addresses (their services bind there: every byte between the sites
crosses the tbf-shaped link), TLS is on across it (``braid certs`` for those hosts) and the server
listens on a root-namespace address both namespaces reach unshaped."""

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


def link_role(site: dict) -> str:
    """The namespace of ``bench.netns.shaped_link`` a site runs in."""
    return "train" if "training" in site["roles"] else "gen"


def _write_sites(tmp: Path, link) -> dict[str, str]:
    """tmp/sites.yaml (ports 0; on the link: its hosts and TLS); returns site -> namespace."""
    sites = yaml.safe_load(SITES.read_text())
    for site in sites["sites"]:
        # tests bind free ports
        site["sgs_port"] = site["router_port"] = site["relay_port"] = site["relay_tls_port"] = 0
        if link is not None:
            site["host"] = link.address(link_role(site))
    if link is not None:
        sites["tls"] = {"enabled": True, "dir": str(tmp / "certs-link")}
    (tmp / "sites.yaml").write_text(yaml.safe_dump(sites))
    if link is None:
        return {}
    from services.common.certs import make_certs

    make_certs(tmp / "sites.yaml")
    return {s["name"]: link.names[link_role(s)] for s in sites["sites"]}


@contextmanager
def prefect_server(tmp: Path, link=None) -> Iterator[dict]:
    """The server's state (``flows.server.start``'s: ``api_url``, workers) while the block runs;
    ``link``: a ``bench.netns.ShapedLink`` to run the sites in (module docstring)."""
    netns = _write_sites(tmp, link)
    saved = os.environ.get("PREFECT_SERVER_API_AUTH_STRING")
    os.environ["PREFECT_SERVER_API_AUTH_STRING"] = AUTH
    host = link.server_host if link is not None else "127.0.0.1"
    opts = ServerOptions(host=host, port=free_port(), sites_file=str(tmp / "sites.yaml"), state_dir=str(tmp / "state"),
                         root=str(ROOT), worker_netns=netns)
    try:
        yield start(opts)
    finally:
        stop(opts.state_dir)
        if saved is None:
            os.environ.pop("PREFECT_SERVER_API_AUTH_STRING", None)
        else:
            os.environ["PREFECT_SERVER_API_AUTH_STRING"] = saved
