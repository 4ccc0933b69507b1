"""deploy/prefect.yaml against the site config and the flows; the two-site watch policy; artifacts."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from flows.artifacts import embed_images, metrics_table
from flows.two_site import GENERATION_FLOW, TRAINING_FLOW, SiteObservation, TwoSiteConfig, not_started, verdict
from services.common.config import load_config
from services.common.sites import load_sites

ROOT = Path(__file__).resolve().parents[2]
PREFECT_FILE = ROOT / "deploy/prefect.yaml"
SITES = load_sites(ROOT / "deploy/sites/local-two-site.yaml")


def _deployments() -> list[dict]:
    return yaml.safe_load(PREFECT_FILE.read_text())["deployments"]


def _flow(entrypoint: str):
    from prefect.flows import load_flow_from_entrypoint

    return load_flow_from_entrypoint(str(ROOT / entrypoint))


def test_every_deployment_runs_on_a_pool_of_the_site_config():
    pools = {s.work_pool for s in SITES.sites}
    for dep in _deployments():
        assert dep["work_pool"]["name"] in pools, dep["name"]
        assert dep.get("enforce_parameter_schema") is True, dep["name"]


def test_each_site_has_its_service_flow_deployed_on_its_own_pool():
    by_flow: dict[str, dict[str, str]] = {}
    for dep in _deployments():
        by_flow.setdefault(_flow(dep["entrypoint"]).name, {})[dep["name"]] = dep["work_pool"]["name"]
    for site in SITES.generation_sites:
        assert by_flow[GENERATION_FLOW][site.name] == site.work_pool
    assert by_flow[TRAINING_FLOW][SITES.training_site.name] == SITES.training_site.work_pool
    assert by_flow["rl_training"]["rl-training"] == SITES.training_site.work_pool  # the controller runs at training


def test_rl_training_deployment_defaults_are_the_make_run_config():
    from flows.deploy_steps import run_config

    dep = next(d for d in _deployments() if d["name"] == "rl-training")
    step = dep["build"][0]["flows.deploy_steps.run_config"]
    assert dep["parameters"]["config"] == "{{ " + step["id"] + ".config }}"
    assert (run_config(str(ROOT / step["path"]))["config"]
            == load_config(ROOT / "deploy/configs/default.yaml").model_dump(mode="json"))
    assert load_sites(ROOT / dep["parameters"]["sites"]["sites_file"]) == SITES
    TwoSiteConfig.model_validate(dep["parameters"]["sites"])


def test_parameter_schema_carries_bounds_and_help_for_the_ui_form():
    from prefect.utilities.callables import parameter_schema

    from flows.rl_training import rl_training

    schema = parameter_schema(rl_training).model_dump()
    assert list(schema["properties"]) == ["config", "sites", "config_path", "overrides", "plan"]
    assert all(p.get("description") for p in schema["properties"].values())
    iterations = schema["definitions"]["TrainerConfig"]["properties"]["iterations"]
    assert iterations["minimum"] == 1 and iterations["description"]
    start = schema["definitions"]["TwoSiteConfig"]["properties"]["start_timeout_s"]
    assert start["minimum"] == 5.0 and start["maximum"] == 3600.0


def test_server_side_schema_validation_names_the_field():
    """The check the server runs on create_flow_run (enforce_parameter_schema)."""
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools.validation import ValidationError, validate

    from flows.rl_training import rl_training

    schema = parameter_schema(rl_training).model_dump()
    config = load_config(ROOT / "deploy/configs/smoke.yaml").model_dump(mode="json")
    validate({"config": config}, schema, raise_on_error=True)
    config["trainer"]["lr"] = 0.0
    with pytest.raises(ValidationError, match=r"config\.trainer\.lr"):
        validate({"config": config}, schema, raise_on_error=True)


def _obs(state: str, waited: float = 0.0, role: str = "generation", message: str = "") -> SiteObservation:
    return SiteObservation(role, "gen-site", "braid-generation", "brave-otter", state, message, waited)


def test_a_run_no_worker_picks_up_fails_after_the_timeout_naming_the_pool():
    assert not_started(_obs("SCHEDULED", waited=59), 60) is None
    message = not_started(_obs("SCHEDULED", waited=61), 60)
    assert ("no worker of work pool 'braid-generation'" in message
            and "prefect worker start --pool braid-generation" in message)
    assert "took it but it did not start (PENDING)" in not_started(_obs("PENDING", waited=61), 60)
    assert not_started(_obs("RUNNING", waited=600), 60) is None


def test_verdict_reports_the_first_site_that_ended_or_stalled():
    assert verdict([_obs("RUNNING"), _obs("RUNNING", role="training")], 60) is None
    died = verdict([_obs("FAILED", message="ServiceDied: sgs-0 exited"), _obs("RUNNING", role="training")], 60)
    assert died.startswith("generation site 'gen-site'") and "ended FAILED: ServiceDied: sgs-0 exited" in died
    assert "ended COMPLETED" in verdict([_obs("COMPLETED")], 60)  # a server must not finish on its own
    assert "waited 70s" in verdict([_obs("RUNNING"), _obs("SCHEDULED", waited=70, role="training")], 60)


def test_metrics_table_rounds_and_renames():
    rows = [{"iteration": 0, "weight_version": 1, "reward_mean": 0.123456,
             "push_stall_s": 0.0021, "response_lens": [1, 2]}]
    assert metrics_table(rows) == [{"iteration": 1, "weight version": 1, "reward": 0.123, "push stall ms": 2.1}]


def test_embed_images_inlines_existing_pngs_only(tmp_path):
    data = b"\x89PNG-bytes"
    (tmp_path / "a.png").write_bytes(data)
    out = embed_images("x ![curve](a.png) y ![gone](missing.png)", tmp_path)
    assert f"![curve](data:image/png;base64,{base64.b64encode(data).decode()})" in out
    assert "![gone](missing.png)" in out


def test_server_state_and_help_need_no_server(tmp_path):
    from flows.server import read_state, stop

    assert read_state(tmp_path) is None and stop(tmp_path) == []
    out = subprocess.run([sys.executable, "-m", "flows.cli", "server", "start", "--help"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "--port" in out.stdout and "--state-dir" in out.stdout, out.stderr


def test_server_banner_names_every_deployment_of_the_prefect_file():
    from flows.server import deployment_names, describe

    names = deployment_names(PREFECT_FILE, ROOT)
    assert names == [f"{_flow(d['entrypoint']).name}/{d['name']}" for d in _deployments()]  # the flows' own names
    assert {"retrain_ranker/retrain-ranker", "plan_allocation/plan-allocation", "rl_training/rl-training"} <= set(names)
    banner = describe({"url": "http://h:1", "api_url": "http://h:1/api", "state_dir": "/s", "workers": [],
                       "deployments": names})
    assert all(f"deployment:  {name}" in banner for name in names)


def test_server_refuses_a_prefect_file_whose_entrypoint_is_missing(tmp_path):
    from flows.server import ServerError, deployment_names

    bad = tmp_path / "prefect.yaml"
    bad.write_text("deployments:\n  - name: x\n    entrypoint: flows/rl_training.py:no_such_flow\n")
    with pytest.raises(ServerError, match="has no function 'no_such_flow'"):
        deployment_names(bad, ROOT)
    bad.write_text("deployments:\n  - name: x\n")
    with pytest.raises(ServerError, match="cannot read its deployments"):
        deployment_names(bad, ROOT)


def test_server_refuses_a_worker_namespace_for_a_site_it_does_not_have(tmp_path):
    from flows.server import ServerError, ServerOptions, start

    opts = ServerOptions(sites_file=str(ROOT / "deploy/sites/local-two-site.yaml"), state_dir=str(tmp_path / "state"),
                         root=str(ROOT), worker_netns={"gen-site": "ns-a", "no-such-site": "ns-b"})
    with pytest.raises(ServerError, match=r"worker_netns names sites \['no-such-site'\]"):
        start(opts)
    assert not (tmp_path / "state").exists()  # refused before anything started


def test_deploy_step_output_is_json():
    from flows.deploy_steps import run_config

    json.dumps(run_config(str(ROOT / "deploy/configs/smoke.yaml")))


@contextmanager
def _api_server(handler):
    """A stand-in Prefect API on a free loopback port; yields its API URL."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api"
    finally:
        server.shutdown()


def test_api_request_retries_a_busy_server_then_returns_its_answer():
    import http.server

    from flows.server import api_request

    answers = [503, 503, 201]
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append(self.rfile.read(int(self.headers["Content-Length"])))
            code = answers.pop(0)
            body = b'{"id": "run"}' if code == 201 else b'{"exception_message": "Service Unavailable"}'
            self.send_response(code)
            if code == 503:
                self.send_header("Retry-After", "0.01")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with _api_server(Handler) as url:
        assert api_request(url, "POST", "/x", {"a": 1}) == (201, {"id": "run"})
        assert seen == [b'{"a": 1}'] * 3
        answers.extend([503, 503])
        assert api_request(url, "POST", "/x", {"a": 1}, retries=1)[0] == 503  # gives up with the last answer


def test_api_request_retries_a_get_that_timed_out_but_never_a_write(monkeypatch):
    import http.server
    import time

    import flows.server
    from flows.server import api_request

    monkeypatch.setattr(flows.server, "REQUEST_TIMEOUT_S", 0.3)
    calls = {"GET": 0, "POST": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            calls[self.command] += 1
            if self.command == "POST" or calls["GET"] == 1:
                time.sleep(0.6)  # a starved server: the client gives up first
            body = b'{"state": "COMPLETED"}'
            try:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:  # the client gave up on this one
                pass

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    with _api_server(Handler) as url:
        assert api_request(url, "GET", "/flow_runs/x") == (200, {"state": "COMPLETED"})
        assert calls["GET"] == 2
        with pytest.raises(TimeoutError):
            api_request(url, "POST", "/x", {"a": 1})
        assert calls["POST"] == 1



def test_workers_are_stopped_side_by_side_within_one_grace():
    """Each process takes 1.5 s to shut down after SIGTERM: stopped one after the other they would
    take 3 s; with one grace for all, 1.5 s and a little."""
    import os
    import time

    from flows.server import _terminate_all

    slow = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: (time.sleep(1.5), sys.exit(0)))\n"
            "print('up', flush=True)\ntime.sleep(60)")
    procs = [subprocess.Popen([sys.executable, "-c", slow], start_new_session=True, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "up"  # the handler is installed
        t0 = time.monotonic()
        ended = _terminate_all([p.pid for p in procs], grace_s=20)
        elapsed = time.monotonic() - t0
        assert sorted(ended) == sorted(p.pid for p in procs)
        assert all(p.poll() is not None for p in procs)
        assert elapsed < 2.8, elapsed
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)


def test_plan_allocation_needs_no_parameter():
    """The planning deployment runs out of the box: the local tiny model on this machine's cores."""
    from prefect.utilities.callables import parameter_schema

    from allocator.allocate import plan_files
    from flows.plan_allocation import PlanParams, plan_allocation

    assert not parameter_schema(plan_allocation).model_dump().get("required")
    p = PlanParams()
    assert all((ROOT / f).is_file() for f in (p.cluster_file, p.workload_file))
    plan = plan_files(str(ROOT / p.cluster_file), p.model, str(ROOT / p.workload_file), objective=p.objective)
    assert plan["model"] == "braid-tiny" and plan["gen_instances"] >= 1
