"""``braid server``: a local Prefect server with Braid's work pools, deployments and workers.

``start`` runs, in order: ``prefect server start`` (API + UI on ``host:port``, its database
under the state directory), one ``process`` work pool per site of the site config, ``prefect
deploy --all`` for ``deploy/prefect.yaml``, and one process worker per site pool; it then waits
until every pool reports a live worker and prints the UI address. Everything it starts runs in
its own session with its log and pid under the state directory (``.cache/server`` by default),
recorded in ``state.json``. ``stop`` stops the workers first (so no flow run is left without a
worker mid-way through a server shutdown), then the server. A second ``start`` while the
recorded server is alive only reports it. ``ServerOptions.worker_netns`` starts a site's worker
inside a network namespace (``ip netns exec``): its flow runs, and the site services they start,
run there too (the two-site test across a shaped link, ``bench/netns.py``).

Auth: when ``PREFECT_SERVER_API_AUTH_STRING`` (``user:password``) is set in the environment of
``start``, the server requires it (HTTP basic auth on every API route except the health
probes), and the deploy step and the workers get it as ``PREFECT_API_AUTH_STRING``; every other
client needs that variable too (``make server`` prints what to export).
"""

from __future__ import annotations

import ast
import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from flows.processes import pid_alive
from services.common.atomic import write_json_atomic

HEALTH_TIMEOUT_S = 180.0  # first start migrates the database: ~36 s on an idle 2-core machine
WORKER_TIMEOUT_S = 120.0
STOP_GRACE_S = 30.0
WORKER_QUERY_S = "2"  # how often local workers poll for runs (Prefect's default is 10 s)


class ServerError(RuntimeError):
    """The server, a pool, the deployment step or a worker failed to come up."""


@dataclass
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 4200
    sites_file: str = "deploy/sites/local-two-site.yaml"
    prefect_file: str = "deploy/prefect.yaml"
    state_dir: str = ".cache/server"
    root: str = field(default_factory=lambda: str(Path.cwd()))  # where `prefect deploy` runs (entrypoints' base)
    # site -> network namespace its worker (and so every flow run it starts) runs in; the server's
    # host must then be an address that namespace reaches (bench/netns.py: two sites on one machine)
    worker_netns: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"


def _state_path(state_dir: str | Path) -> Path:
    return Path(state_dir) / "state.json"


def read_state(state_dir: str | Path) -> dict | None:
    path = _state_path(state_dir)
    return json.loads(path.read_text()) if path.exists() else None


def _write_state(state_dir: str | Path, state: dict) -> None:
    write_json_atomic(_state_path(state_dir), state, indent=2)


def client_env(api_url: str, prefect_home: Path) -> dict[str, str]:
    """Environment of every Prefect client we start (deploy, workers, their flow runs)."""
    env = dict(os.environ)
    env.update(
        PREFECT_API_URL=api_url,
        PREFECT_HOME=str(prefect_home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_WORKER_QUERY_SECONDS=WORKER_QUERY_S,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        PYTHONUNBUFFERED="1",
    )
    auth = os.environ.get("PREFECT_SERVER_API_AUTH_STRING")
    if auth:
        env["PREFECT_API_AUTH_STRING"] = os.environ.get("PREFECT_API_AUTH_STRING", auth)
    return env


RETRY_STATUSES = (429, 503)  # the server is busy (e.g. its SQLite database is locked): try again
RETRIES = 6
REQUEST_TIMEOUT_S = 10.0


def api_request(
    api_url: str, method: str, path: str, body: dict | None = None, auth: str | None = None, *, retries: int = RETRIES
) -> tuple[int, dict | list | None]:
    """One JSON request to the Prefect REST API: (status, decoded body or None).

    A 429 or 503 answer (a busy server; nothing was done) is retried with exponential backoff,
    honouring Retry-After, as Prefect's own client does; the last answer is returned. A GET that
    times out (a starved server) is retried too: reading twice is harmless, writing twice is not."""
    for attempt in range(retries + 1):
        try:
            status, decoded, retry_after = _request_once(api_url, method, path, body, auth)
        except (TimeoutError, urllib.error.URLError) as err:
            timed_out = isinstance(err, TimeoutError) or isinstance(getattr(err, "reason", None), TimeoutError)
            if method != "GET" or not timed_out or attempt == retries:
                raise
            status, decoded, retry_after = 0, None, None
        if status and (status not in RETRY_STATUSES or attempt == retries):
            return status, decoded
        time.sleep(retry_after if retry_after is not None else min(8.0, 0.5 * 2**attempt))
    raise AssertionError("unreachable")


def _request_once(
    api_url: str, method: str, path: str, body: dict | None, auth: str | None
) -> tuple[int, dict | list | None, float | None]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{api_url}{path}", data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None, None
    except urllib.error.HTTPError as err:
        raw = err.read()
        after = err.headers.get("Retry-After")
        retry_after = float(after) if after and after.replace(".", "", 1).isdigit() else None
        try:
            return err.code, json.loads(raw) if raw else None, retry_after
        except json.JSONDecodeError:
            return err.code, {"detail": raw.decode(errors="replace")}, retry_after


def _spawn(cmd: list[str], env: dict[str, str], log: Path, cwd: str) -> int:
    with log.open("a") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
    return proc.pid


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "<no log>"


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _prefect(*args: str) -> list[str]:
    return [sys.executable, "-m", "prefect", *args]


def _run(cmd: list[str], env: dict[str, str], cwd: str, what: str, log: Path) -> None:
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    if proc.returncode != 0:
        raise ServerError(f"{what} failed (exit {proc.returncode}); last lines of {log}:\n{_tail(log)}")


def _wait_health(opts: ServerOptions, pid: int, log: Path) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            raise ServerError(f"the Prefect server exited; last lines of {log}:\n{_tail(log)}")
        try:
            status, _ = api_request(opts.api_url, "GET", "/health")
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(1.0)
    raise ServerError(f"the Prefect server did not answer {opts.api_url}/health within {HEALTH_TIMEOUT_S:.0f}s")


def _wait_workers(opts: ServerOptions, pools: list[str], workers: list[dict]) -> None:
    auth = os.environ.get("PREFECT_SERVER_API_AUTH_STRING")
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    pending = list(pools)
    while pending and time.monotonic() < deadline:
        for w in workers:
            if not pid_alive(w["pid"]):
                raise ServerError(
                    f"worker for pool {w['pool']!r} exited; last lines of {w['log']}:\n{_tail(Path(w['log']))}"
                )
        status, body = api_request(opts.api_url, "GET", f"/work_pools/{pending[0]}", auth=auth)
        if status == 200 and isinstance(body, dict) and body.get("status") == "READY":
            pending.pop(0)
            continue
        time.sleep(1.0)
    if pending:
        raise ServerError(f"no worker became ready for pools {pending} within {WORKER_TIMEOUT_S:.0f}s")


def _flow_name(source: Path, func: str) -> str:
    """The Prefect flow name of ``func`` in ``source``, read from its ``@flow(name=...)`` without
    importing the module (Prefect's default, the function name with ``-`` for ``_``, otherwise)."""
    tree = ast.parse(source.read_text(encoding="utf-8"), str(source))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == func:
            for dec in node.decorator_list:
                for kw in dec.keywords if isinstance(dec, ast.Call) else []:
                    if kw.arg == "name" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                        return kw.value.value
            return func.replace("_", "-")
    raise ServerError(f"{source} has no function {func!r} (a deployment's entrypoint)")


def deployment_names(prefect_file: str | Path, root: str | Path) -> list[str]:
    """``<flow>/<deployment>`` of every deployment in ``prefect_file`` (entrypoints relative to ``root``),
    in the file's order: what ``prefect deploy --all`` creates."""
    try:
        deployments = yaml.safe_load(Path(prefect_file).read_text(encoding="utf-8"))["deployments"]
        entries = [(d["name"], *d["entrypoint"].rsplit(":", 1)) for d in deployments]
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as err:
        raise ServerError(f"{prefect_file}: cannot read its deployments (name and entrypoint each): {err!r}") from None
    return [f"{_flow_name(Path(root) / path, func)}/{name}" for name, path, func in entries]


def start(opts: ServerOptions) -> dict:
    """Start server, pools, deployments and workers; return the state (see module docstring)."""
    from services.common.sites import load_sites

    sites = load_sites(opts.sites_file)  # fail on a bad site or prefect file before starting anything
    unknown = sorted(set(opts.worker_netns) - {s.name for s in sites.sites})
    if unknown:
        raise ServerError(f"worker_netns names sites {unknown} that {opts.sites_file} does not have "
                          f"(its sites: {[s.name for s in sites.sites]})")
    deployments = deployment_names(Path(opts.root) / opts.prefect_file, opts.root)
    state_dir = Path(opts.state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    existing = read_state(state_dir)
    if existing and pid_alive(existing["server"]["pid"]):
        return {**existing, "already_running": True}
    if not _port_free(opts.host, opts.port):
        raise ServerError(f"port {opts.port} on {opts.host} is in use; choose another (make server PORT=...)")
    home = state_dir / "prefect-home"
    home.mkdir(exist_ok=True)
    env = client_env(opts.api_url, home)
    state: dict = {
        "url": opts.url, "api_url": opts.api_url, "prefect_home": str(home), "state_dir": str(state_dir),
        "auth": bool(os.environ.get("PREFECT_SERVER_API_AUTH_STRING")), "workers": [], "deployments": deployments,
    }
    server_log = state_dir / "server.log"
    server_env = {**env, "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false"}
    pid = _spawn(_prefect("server", "start", "--host", opts.host, "--port", str(opts.port)), server_env, server_log,
                 opts.root)
    state["server"] = {"pid": pid, "log": str(server_log)}
    _write_state(state_dir, state)
    try:
        _wait_health(opts, pid, server_log)
        setup_log = state_dir / "setup.log"
        for site in sites.sites:
            _run(_prefect("work-pool", "create", site.work_pool, "--type", "process", "--overwrite"),
                 env, opts.root, f"creating work pool {site.work_pool!r}", setup_log)
        _run(_prefect("--no-prompt", "deploy", "--all", "--prefect-file", opts.prefect_file),
             env, opts.root, f"prefect deploy --all --prefect-file {opts.prefect_file}", setup_log)
        for site in sites.sites:
            log = state_dir / f"worker-{site.name}.log"
            ns = opts.worker_netns.get(site.name)
            wpid = _spawn([*(["ip", "netns", "exec", ns] if ns else []), *_prefect(
                "worker", "start", "--pool", site.work_pool, "--type", "process", "--name", f"braid-{site.name}")],
                env, log, opts.root)
            state["workers"].append({"site": site.name, "pool": site.work_pool, "pid": wpid, "log": str(log),
                                     "netns": ns or ""})
            _write_state(state_dir, state)
        _wait_workers(opts, [s.work_pool for s in sites.sites], state["workers"])
    except BaseException:
        stop(state_dir)
        raise
    return state


def _terminate(pid: int, grace_s: float) -> bool:
    """SIGTERM the process group of ``pid`` (its children too), SIGKILL after ``grace_s``."""
    return bool(_terminate_all([pid], grace_s))


def _terminate_all(pids: list[int], grace_s: float) -> list[int]:
    """SIGTERM the process groups of ``pids`` at once, SIGKILL what is left after ``grace_s`` (one
    grace for all: workers shut down side by side); returns the pids that were running."""
    signalled = []
    for pid in pids:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
                signalled.append(pid)
    deadline = time.monotonic() + grace_s
    while any(pid_alive(p) for p in signalled) and time.monotonic() < deadline:
        for p in signalled:
            _reap(p)
        time.sleep(0.2)
    for p in signalled:
        if pid_alive(p):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p, signal.SIGKILL)
        _reap(p)
    return signalled


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def stop_worker(state_dir: str | Path, site: str) -> bool:
    """Stop the worker of one site (the rest keeps running); True if it was running."""
    state = read_state(state_dir)
    for w in (state or {}).get("workers", []):
        if w["site"] == site:
            return _terminate(w["pid"], STOP_GRACE_S)
    raise KeyError(f"no worker for site {site!r} in {_state_path(state_dir)}")


def stop(state_dir: str | Path) -> list[str]:
    """Stop the workers, then the server; return what was stopped."""
    state = read_state(state_dir)
    if state is None:
        return []
    workers = state.get("workers", [])
    ended = set(_terminate_all([w["pid"] for w in workers], STOP_GRACE_S))
    stopped = [f"worker {w['pool']} (pid {w['pid']})" for w in workers if w["pid"] in ended]
    if _terminate(state["server"]["pid"], STOP_GRACE_S):
        stopped.append(f"server {state['url']} (pid {state['server']['pid']})")
    _state_path(state_dir).unlink(missing_ok=True)
    return stopped


def describe(state: dict) -> str:
    lines = [
        f"Prefect UI:  {state['url']}",
        f"API:         export PREFECT_API_URL={state['api_url']}",
    ]
    if state.get("auth"):
        lines.append("Auth:        export PREFECT_API_AUTH_STRING=\"$PREFECT_SERVER_API_AUTH_STRING\"")
    lines += [f"worker:      pool {w['pool']} (site {w['site']}, pid {w['pid']}, log {w['log']})"
              for w in state["workers"]]
    lines += [f"deployment:  {name}" + ("  (Run it from the UI)" if name == "rl_training/rl-training" else "")
              for name in state.get("deployments", [])]
    lines += [
        f"logs/state:  {state['state_dir']}",
        "stop:        make server-stop",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="braid server", description="local Prefect server with Braid's deployments")
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4200)
    parser.add_argument("--sites", default="deploy/sites/local-two-site.yaml", help="site config: pools and workers")
    parser.add_argument("--prefect-file", default="deploy/prefect.yaml")
    parser.add_argument("--state-dir", default=".cache/server", help="pids, logs, Prefect home")
    ns = parser.parse_args(argv)
    if ns.action == "stop":
        stopped = stop(ns.state_dir)
        print("stopped: " + ", ".join(stopped) if stopped else "nothing was running")
        return 0
    if ns.action == "status":
        state = read_state(ns.state_dir)
        if not state or not pid_alive(state["server"]["pid"]):
            print("not running")
            return 1
        print(describe(state))
        return 0
    opts = ServerOptions(ns.host, ns.port, ns.sites, ns.prefect_file, ns.state_dir)
    print(f"starting a Prefect server on {opts.url} (logs in {ns.state_dir}) ...", flush=True)
    try:
        state = start(opts)
    except Exception as err:  # noqa: BLE001 - report and exit non-zero; start() already stopped what it had started
        print(f"braid server: {err}", file=sys.stderr)
        return 1
    if state.get("already_running"):
        print(f"already running at {state['url']}")
    print(describe(state))
    return 0
