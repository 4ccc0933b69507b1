"""Mutual TLS on the Generation service: an SGS instance and the SGS router as real processes
serving ``--tls-dir/--tls-site`` on loopback (port 0), the router in front of a plaintext
instance (its own site's link stays plaintext)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from services.common.certs import TlsFiles, make_ca, make_site_cert
from services.common.types import GenerateParams, PromptSpec
from services.generation.client import GenerationClient
from tests.conftest import FAST_ENGINE, ROOT, SGSProcess, spawn_service, start_sgs, stop_sgs

OVERRIDES = [FAST_ENGINE, "generation.max_new_tokens=16", "generation.max_inflight=4"]


@dataclass(frozen=True)
class Certs:
    dir: Path  # the CA and both sites' certificates (`braid certs` layout)
    client: TlsFiles  # the training site's: a caller from another site
    stranger: TlsFiles  # the same CA to check the server, but a certificate from another CA


def _make_certs(root: Path) -> Certs:
    ca_cert, ca_key = make_ca(root / "certs")
    make_site_cert(root / "certs", "gen-site", ["127.0.0.1"], ca_cert, ca_key)
    client = make_site_cert(root / "certs", "train-site", ["127.0.0.1"], ca_cert, ca_key)
    other_cert, other_key = make_ca(root / "other")
    other = make_site_cert(root / "other", "train-site", ["127.0.0.1"], other_cert, other_key)
    return Certs(root / "certs", client, TlsFiles(client.ca, other.cert, other.key))


def _start_tls_sgs(workdir: Path, checkpoint: Path, certs: Certs) -> SGSProcess:
    from services.common.config import load_config, write_config

    write_config(load_config(ROOT / "deploy/configs/smoke.yaml", OVERRIDES), workdir / "config.json")
    port_file, log = workdir / "sgs.port", workdir / "sgs.log"
    proc, ports = spawn_service(
        ["services.generation", "--config", str(workdir / "config.json"), "--model", str(checkpoint), "--port", "0",
         "--port-file", str(port_file), "--tls-dir", str(certs.dir), "--tls-site", "gen-site"],
        port_file, log, what="SGS (TLS)",
    )
    return SGSProcess(proc, f"127.0.0.1:{ports[0]}", log)


def _start_tls_router(workdir: Path, checkpoint: Path, config: Path, instance: str, certs: Certs) -> SGSProcess:
    port_file, log = workdir / "router.port", workdir / "router.log"
    proc, ports = spawn_service(
        ["services.generation.router_main", "--config", str(config), "--model", str(checkpoint),
         "--instances", instance, "--port", "0", "--port-file", str(port_file),
         "--tls-dir", str(certs.dir), "--tls-site", "gen-site"],
        port_file, log, what="router (TLS)",
    )
    return SGSProcess(proc, f"127.0.0.1:{ports[0]}", log)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    root = tmp_path_factory.mktemp("tls")
    (root / "certs").mkdir()
    (root / "other").mkdir()
    return _make_certs(root)


@pytest.fixture(scope="module")
def tls_stack(tmp_path_factory, tiny_checkpoint, certs) -> Iterator[tuple[SGSProcess, SGSProcess]]:
    """(an SGS instance serving mutual TLS, a TLS router in front of a plaintext instance); the two
    instances start side by side."""
    with ThreadPoolExecutor(2) as pool:
        tls_job = pool.submit(_start_tls_sgs, tmp_path_factory.mktemp("sgs-tls"), tiny_checkpoint, certs)
        plain_job = pool.submit(start_sgs, tmp_path_factory.mktemp("sgs-plain"), tiny_checkpoint, OVERRIDES)
        tls_sgs, plain = tls_job.result(), plain_job.result()
    router = _start_tls_router(tmp_path_factory.mktemp("router"), tiny_checkpoint, plain.log.parent / "config.json",
                               plain.address, certs)
    yield tls_sgs, router
    for proc in (router, tls_sgs, plain):
        assert stop_sgs(proc) == 0, proc.log.read_text()[-3000:]


def _generate(client: GenerationClient) -> list:
    params = GenerateParams(samples_per_prompt=2, max_new_tokens=4)
    return list(client.generate([PromptSpec("p0", (1, 5, 6, 7))], params))


def _refused(client: GenerationClient) -> grpc.StatusCode:
    with client, pytest.raises(grpc.RpcError) as err:
        client.health()
    return err.value.code()


def test_tls_client_gets_health_and_a_generate_stream(tls_stack, certs):
    tls_sgs, _ = tls_stack
    with GenerationClient(tls_sgs.address, tls=certs.client) as client:
        assert client.wait_ready(timeout_s=30).weight_version == 0
        samples = _generate(client)
    assert len(samples) == 2 and all(1 <= len(s.token_ids) <= 4 for s in samples)
    named = TlsFiles(certs.client.ca, certs.client.cert, certs.client.key, server_name="gen-site")  # SAN, not the host
    with GenerationClient(tls_sgs.address, tls=named) as client:
        assert client.health().weight_version == 0
    assert "mutual TLS" in tls_sgs.log.read_text()


def test_plaintext_client_is_refused_on_the_tls_port(tls_stack):
    tls_sgs, router = tls_stack
    assert _refused(GenerationClient(tls_sgs.address)) == grpc.StatusCode.UNAVAILABLE
    assert _refused(GenerationClient(router.address)) == grpc.StatusCode.UNAVAILABLE


def test_certificate_from_another_ca_is_refused(tls_stack, certs):
    tls_sgs, router = tls_stack
    assert _refused(GenerationClient(tls_sgs.address, tls=certs.stranger)) == grpc.StatusCode.UNAVAILABLE
    assert _refused(GenerationClient(router.address, tls=certs.stranger)) == grpc.StatusCode.UNAVAILABLE


def test_tls_router_in_front_of_a_plaintext_instance(tls_stack, certs):
    _, router = tls_stack
    with GenerationClient(router.address, tls=certs.client) as client:
        assert client.wait_ready(timeout_s=30).weight_version == 0
        samples = _generate(client)
    assert len(samples) == 2 and {s.sample_index for s in samples} == {0, 1}


@pytest.mark.parametrize("module", ["services.generation", "services.generation.router_main"])
def test_missing_tls_files_stop_the_process_at_start_naming_them(tmp_path: Path, module: str):
    args = ["--config", "unused.json", "--model", "unused", "--tls-dir", str(tmp_path), "--tls-site", "gen-site"]
    if module.endswith("router_main"):
        args += ["--instances", "127.0.0.1:1"]
    out = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "TLS files missing" in out.stderr and str(tmp_path / "gen-site.pem") in out.stderr, out.stderr

