"""Drive the Prefect UI in headless Chromium: trigger an rl_training run from the deployment's
Run form and save screenshots of the form and of the finished run's artifacts in docs/img/.

    .venv/bin/pip install -e '.[ui]'          # playwright (Python only; never `playwright install`)
    apt-get install -y chromium               # Debian's browser, used through executable_path
    .venv/bin/python bench/ui_screenshot.py [--quick] [--out docs/img]

What it does, as a person would: starts its own `braid server` (free port, state under
.cache/ui-screenshot), opens the rl-training deployment, clicks Run -> Custom run (the form shows
deploy/configs/default.yaml's values with every field's help text), enters an out-of-range
learning rate and submits (the server refuses it; the UI shows the field's message), restores
it, types the run's length into the Iterations and eval Prompts fields and submits. It waits for
the run to finish (two-site mode: the generation and training sites run as their own flow runs
on their pools' workers), then photographs the run page and its artifacts. --quick starts from
the smoke config instead (seconds-long run, meaningless plots): for checking the script.
--artifacts-of FLOW_RUN_ID --url URL only photographs a finished run's artifacts on a running
server (e.g. one triggered by hand from the UI). A default run waits for a cached warm start of
the default model (~1.5 min on an idle machine, much longer on a busy one): --timeout.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.parse
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flows.processes import free_port  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
# Flags that keep Chromium from calling home (no network here) and from needing a sandbox as root.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]
VIEWPORT = {"width": 1400, "height": 1000}



def _wait_final(api_url: str, flow_run_id: str, timeout_s: float) -> dict:
    from flows.server import api_request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _, run = api_request(api_url, "GET", f"/flow_runs/{flow_run_id}")
        if run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return run
        time.sleep(3)
    raise TimeoutError(f"flow run {flow_run_id} did not finish within {timeout_s:.0f}s")


def _open_form(page, ui: str, deployment_id: str, quick: bool) -> None:
    """Deployment page -> Run -> Custom run: the form with the deployment's default parameters."""
    from flows.server import api_request

    page.goto(f"{ui}/v2/deployments/deployment/{deployment_id}")
    page.get_by_role("button", name="Run").first.click()
    page.get_by_role("menuitem", name="Custom run").click()
    page.get_by_text("Parameters", exact=True).wait_for()
    if quick:  # the smoke config, through the form's own parameters URL
        from services.common.config import load_config

        _, dep = api_request(f"{ui}/api", "GET", f"/deployments/{deployment_id}")
        params = {**dep["parameters"],
                  "config": load_config(ROOT / "deploy/configs/smoke.yaml").model_dump(mode="json")}
        page.goto(f"{page.url.split('?')[0]}?parameters={urllib.parse.quote(json.dumps(params))}")
        page.get_by_text("Parameters", exact=True).wait_for()


def _new_run(api_url: str, deployment_id: str, after: float) -> str:
    """The flow run the form just created (the UI goes back to the deployment page)."""
    from flows.server import api_request

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        _, runs = api_request(api_url, "POST", "/flow_runs/filter", {
            "flow_runs": {"deployment_id": {"any_": [deployment_id]}}, "sort": "EXPECTED_START_TIME_DESC", "limit": 1})
        if runs and datetime.fromisoformat(runs[0]["created"]).timestamp() >= after - 5:
            return runs[0]["id"]
        time.sleep(1)
    raise TimeoutError("the form created no flow run")


def _field(page, label: str, nth: int = 0):
    return page.get_by_label(f"{label} (Optional)", exact=True).nth(nth)


def _shoot(page, path: Path, full_page: bool = False) -> None:
    page.wait_for_timeout(800)
    page.screenshot(path=str(path), full_page=full_page)
    print(f"  wrote {path}")


def shoot_artifacts(page, ui: str, api_url: str, flow_run_id: str, out: Path) -> None:
    """The finished run's page (graph with the site flow runs, Artifacts tab) and its artifacts."""
    from flows.server import api_request

    page.goto(f"{ui}/v2/runs/flow-run/{flow_run_id}")
    page.get_by_role("tab", name="Artifacts").click()
    page.get_by_text("rl-training-report").first.wait_for()
    _shoot(page, out / "ui-run-artifacts.png")
    for key, name in (("rl-training-report", "ui-report.png"), ("rl-training-metrics", "ui-metrics-table.png")):
        _, found = api_request(api_url, "POST", "/artifacts/filter",
                               {"artifacts": {"key": {"any_": [key]}, "flow_run_id": {"any_": [flow_run_id]}}})
        page.goto(f"{ui}/v2/artifacts/artifact/{found[0]['id']}")
        page.wait_for_load_state("networkidle")
        _shoot(page, out / name, full_page=True)


def _browser(pw):
    return pw.chromium.launch_persistent_context(
        tempfile.mkdtemp(prefix="chromium-"), executable_path=CHROMIUM, headless=True, viewport=VIEWPORT,
        args=CHROMIUM_ARGS,
    )


def drive(ui: str, api_url: str, out: Path, quick: bool, iterations: int, eval_prompts: int, timeout_s: float) -> dict:
    from playwright.sync_api import sync_playwright

    from flows.server import api_request

    _, dep = api_request(api_url, "GET", "/deployments/name/rl_training/rl-training")
    with sync_playwright() as pw:
        browser = _browser(pw)
        page = browser.new_page()
        _open_form(page, ui, dep["id"], quick)
        _shoot(page, out / "ui-run-form.png")

        lr = _field(page, "Lr", 1)  # trainer.lr (warmstart.lr comes first)
        lr.fill("0")
        page.get_by_role("button", name="Submit").click()
        page.get_by_text("Validation failed for field 'config.trainer.lr'").first.wait_for(timeout=30_000)
        lr.scroll_into_view_if_needed()
        _shoot(page, out / "ui-run-form-rejected.png")

        # Prefect 3.8.8's form does not submit again after a refused submission: reopen it.
        _open_form(page, ui, dep["id"], quick)
        _field(page, "Iterations").fill(str(iterations))
        _field(page, "Prompts").fill(str(eval_prompts))  # eval.prompts
        submitted = time.time()
        page.get_by_role("button", name="Submit").click()
        page.wait_for_url(lambda url: "/run?" not in url and not url.endswith("/run"), timeout=60_000)
        flow_run_id = _new_run(api_url, dep["id"], submitted)
        print(f"  run {flow_run_id} submitted from the form; waiting for it to finish")
        run = _wait_final(api_url, flow_run_id, timeout_s=timeout_s)
        print(f"  run ended {run['state']['type']}")
        shoot_artifacts(page, ui, api_url, flow_run_id, out)
        browser.close()
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs/img"), help="where the PNGs go")
    parser.add_argument("--quick", action="store_true", help="smoke-sized run (checks the script; dull plots)")
    parser.add_argument("--iterations", type=int, default=20, help="RL iterations typed into the form")
    parser.add_argument("--eval-prompts", type=int, default=200, help="held-out prompts typed into the form")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds to wait for the run")
    parser.add_argument("--state-dir", default=str(ROOT / ".cache/ui-screenshot"))
    parser.add_argument("--artifacts-of", metavar="FLOW_RUN_ID",
                        help="only photograph the artifacts of this finished run, on the server at --url")
    parser.add_argument("--url", default="http://127.0.0.1:4200", help="UI address for --artifacts-of")
    ns = parser.parse_args(argv)
    from flows.server import ServerOptions, describe, start, stop

    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    if ns.artifacts_of:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = _browser(pw)
            shoot_artifacts(browser.new_page(), ns.url, f"{ns.url}/api", ns.artifacts_of, out)
            browser.close()
        return 0
    opts = ServerOptions(port=free_port(), state_dir=ns.state_dir, root=str(ROOT))
    print(f"starting braid server on {opts.url} ...", flush=True)
    state = start(opts)
    print(describe(state), flush=True)
    try:
        iterations = 2 if ns.quick else ns.iterations
        eval_prompts = 32 if ns.quick else ns.eval_prompts
        run = drive(state["url"], state["api_url"], out, ns.quick, iterations, eval_prompts, ns.timeout)
    finally:
        print("stopped: " + ", ".join(stop(opts.state_dir)))
    return 0 if run["state"]["type"] == "COMPLETED" else 1


if __name__ == "__main__":
    sys.exit(main())
