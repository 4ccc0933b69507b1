"""Failure handling with real processes: a dead relay or router is started again on its port, and
a chaos run (``bench/chaos_run.py``) with the master relay and the trainer killed together still
consumes every sample once, within the bound, with the same weights everywhere."""

from __future__ import annotations

import json

import pytest

from bench.chaos_run import Scenario, run_scenario
from flows.processes import ServiceDied, Supervisor, start_relay
from services.weights.client import RelayClient
from tests.conftest import ROOT


def test_a_dead_relay_is_started_again_on_its_port_until_the_limit(tmp_path):
    sup = Supervisor(tmp_path, max_restarts=1)
    try:
        address, _ = start_relay(sup, tmp_path, "relay-0", keep=2, shm=False, max_message_mb=16)
        sup.services[-1].proc.kill()
        sup.services[-1].proc.wait()
        sup.check()  # restarts it, waiting until it serves again
        client = RelayClient(address)
        try:
            assert client.versions().latest <= 0  # the new process answers on the old address
        finally:
            client.close()
        [record] = [json.loads(x) for x in (tmp_path / "recovery" / "services.jsonl").read_text().splitlines()]
        assert record["service"] == "relay-0" and record["exit_code"] == -9 and record["ready_at"] >= record["died_at"]
        assert (tmp_path / "relay-0.log").exists() and list(tmp_path.glob("relay-0.*.log"))  # the dead one's log kept
        sup.services[-1].proc.kill()
        sup.services[-1].proc.wait()
        with pytest.raises(ServiceDied, match="relay-0"):  # beyond max_restarts its death ends the run
            sup.check()
    finally:
        sup.stop_all()


def test_master_relay_and_trainer_killed_together_lose_nothing(tmp_path, tiny_checkpoint):
    s = Scenario("pair", "bounded", ("master_relay", "trainer"))
    r = run_scenario(s, tmp_path, str(tiny_checkpoint), ROOT / "deploy/configs/smoke.yaml", iterations=5, timeout_s=300)
    assert r.completed, r.error
    assert r.faults == ["kill:master_relay", "kill:trainer"]
    assert r.restarts == {"relay-0": 1, "trainer": 1}
    assert r.ledger["ok"] and r.ledger["attempts"] == 2, r.ledger
    assert r.samples_lost == 0 and r.duplicates == 0 and r.violations == 0
    assert r.weights["ok"] and len(r.weights["relay_digests"]) == 2, r.weights
    assert r.weights["relay_digests"]["relay-0"].startswith("sha256:")
    assert r.recovery_s is not None and r.recovery_s > 0
