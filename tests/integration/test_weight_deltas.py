"""Delta weight versions through real relay (and SGS) processes: the publisher sends only the
changed elements, relays forward deltas and commit the full version they lead to, a puller holding
the base takes the delta, and every missing base (a restarted relay, a restarted master, an
instance that skipped a version) falls back to the whole version, counted."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
import torch

from services.common.config import WeightsConfig
from services.run.transport import RelayTransport
from services.weights import delta_blob
from services.weights.client import RelayClient, RelayError, snapshot_blob
from services.weights.delta_blob import Held
from tests.conftest import ROOT, stop_sgs
from tests.integration.relays import holds, start_relay, start_sgs_with_relay, wait_for

CHUNK = 16 * 1024


def versions(n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` float32 'model' states, each a small step from the one before (as an optimizer step is)."""
    gen = torch.Generator().manual_seed(seed)
    state = {"embed.weight": torch.randn(512, 64, generator=gen), "layer.0.w": torch.randn(64, 256, generator=gen),
             "norm.weight": torch.ones(64)}
    out = [state]
    for _ in range(n - 1):
        state = {k: v + 1e-3 * torch.randn(v.shape, generator=gen) for k, v in state.items()}
        out.append(state)
    return out


def held(pulled) -> Held:
    n = pulled.manifest.total_bytes
    return Held(pulled.version, pulled.manifest, memoryview(pulled.blob)[:n], pulled.digest, pulled.blob)


def test_deltas_cross_the_chain_and_a_puller_holding_the_base_gets_the_same_bits(tmp_path: Path):
    relays = [start_relay(tmp_path, f"d{i}") for i in range(2)]
    clients = [RelayClient(r.address) for r in relays]
    cfg = WeightsConfig(chunk_bytes=CHUNK, shm=False, heartbeat_s=0.1, heartbeat_timeout_s=2.0, delta=True,
                        dtype="bfloat16")
    transport = RelayTransport(cfg, relays=[r.address for r in relays])
    states = versions(3)
    site = clients[1]
    try:
        for v, state in enumerate(states, 1):
            transport.publish(v, transport.snapshot(state))
            wait_for(lambda v=v: v in transport.sent and all(holds(c, v) for c in clients), 60,
                     f"both relays hold version {v}")
            if v == 1:
                old = held(site.pull(1, allow_shm=False))  # kept by a puller that will skip version 2
        assert [transport.sent[v]["sent"] for v in (1, 2, 3)] == ["whole", "delta", "delta"]
        full = transport.sent[3]["full_bytes"]
        assert full == sum(t.numel() * 2 for t in states[2].values())  # bfloat16 on the wire (weights.dtype)
        assert 0 < transport.sent[3]["delta_bytes"] < 0.6 * full
        for c in clients:  # both relays committed the full version the publisher digested
            info = c.versions().versions
            assert info[3].digest == transport.sent[3]["digest"] and info[3].delta and info[3].delta_base == 2
            assert not info[2].delta or info[2].delta_base == 1
        base = held(site.pull(2, allow_shm=False))
        want = {k: v.to(torch.bfloat16) for k, v in states[2].items()}
        for client in (site, RelayClient(relays[1].address, data_path="grpc")):  # data channel, then gRPC streams
            got = client.pull(3, allow_shm=False, have=base)
            assert got.delta_base == 2 and got.path.startswith("delta+") and not got.fallback
            assert got.digest == transport.sent[3]["digest"] and 0 < got.delta_bytes < full
            assert all(torch.equal(got.state[k], want[k]) for k in want)
        composed = site.pull(3, allow_shm=False, have=old)  # two versions behind: the chain 1 -> 2 -> 3, composed
        assert composed.delta_base == 1 and composed.path == "delta+tcp" and not composed.fallback
        assert composed.digest == transport.sent[3]["digest"] and 0 < composed.delta_bytes < full
        assert all(torch.equal(composed.state[k], want[k]) for k in want)
        stranger = Held(1, old.manifest, old.view, "sha256:" + "0" * 64)  # a version 1 of other bytes: no chain
        whole = site.pull(3, allow_shm=False, have=stranger)
        assert whole.delta_base is None and "no delta from version 1" in whole.fallback
        assert all(torch.equal(whole.state[k], want[k]) for k in want)
        same_host = site.pull(3, allow_shm=True, have=base)  # shared memory maps the whole version: no fallback
        assert same_host.path == "shm" and not same_host.fallback
    finally:
        transport.close()
        for c in clients:
            c.close()
        for r in relays:
            r.stop()


def test_deltas_cross_sites_over_mutual_tls(tmp_path: Path):
    """The training site's master relay forwards deltas to the generation site's relay on its mutual-TLS
    port (the cross-site link); that relay commits each full version the publisher digested."""
    from services.common.certs import make_certs

    sites = tmp_path / "sites.yaml"
    sites.write_text((ROOT / "deploy/sites/local-two-site.yaml").read_text()
                     .replace("dir: .cache/certs", f"dir: {tmp_path / 'certs'}"))
    files = make_certs(sites)
    tls = ("--tls-dir", str(tmp_path / "certs"))
    master = start_relay(tmp_path, "train", *tls, "--site", "train-site")
    gen = start_relay(tmp_path, "gen", *tls, "--site", "gen-site", "--tls-host", "127.0.0.1")
    cfg = WeightsConfig(chunk_bytes=CHUNK, shm=False, heartbeat_s=0.1, heartbeat_timeout_s=2.0, delta=True,
                        dtype="bfloat16")
    transport = RelayTransport(cfg, relays=[f"{master.address}@train-site",
                                            f"{gen.address}@gen-site@tls://{gen.tls_address}"],
                               training_site="train-site", tls=files["train-site"])
    site = RelayClient(gen.address)  # the generation site's own loopback port
    try:
        for v, state in enumerate(versions(3), 1):
            transport.publish(v, transport.snapshot(state))
            wait_for(lambda v=v: v in transport.sent and holds(site, v), 60, f"the generation site holds version {v}")
        assert [transport.sent[v]["sent"] for v in (1, 2, 3)] == ["whole", "delta", "delta"]
        info = site.versions().versions
        assert all(info[v].digest == transport.sent[v]["digest"] for v in (2, 3))  # a relay keeps 2 versions
        assert info[3].delta and info[3].delta_base == 2  # it came across the link as a delta
    finally:
        transport.close()
        site.close()
        for r in (master, gen):
            r.stop()


def _pushed(client: RelayClient, v: int, state, base: Held | None, dtype: str = "bfloat16") -> Held:
    """Push version ``v`` as the delta from ``base`` (whole without one); returns it as the next base."""
    wb = snapshot_blob(state, CHUNK, None, dtype=dtype)
    enc = delta_blob.encode(wb.manifest, wb.blob.view, version=v, base=base, algo="xxh3_128")
    if base is None:
        assert client.push(wb, v, use_shm=False)
    else:
        assert enc.delta is not None
        assert client.push(enc.delta, v, use_shm=False, delta_base=base.version)
    return Held(v, wb.manifest, wb.blob.view, enc.digest, wb.blob)


def test_a_hop_without_the_base_takes_the_version_whole_and_bad_deltas_are_refused(tmp_path: Path):
    up, down = start_relay(tmp_path, "up"), start_relay(tmp_path, "down")
    uc, dc = RelayClient(up.address), RelayClient(down.address)
    states = versions(5, seed=1)
    try:
        base = _pushed(uc, 1, states[0], None)
        base = _pushed(uc, 2, states[1], base)
        uc.set_chain(1, [[down.address]])  # the newest version goes down whole, then deltas follow
        wait_for(lambda: holds(dc, 2), 60, "the downstream relay holds version 2")
        base = _pushed(uc, 3, states[2], base)
        wait_for(lambda: holds(dc, 3), 60, "the downstream relay holds version 3")
        assert dc.versions().versions[3].delta  # it arrived there as a delta
        port = int(down.address.rsplit(":", 1)[1])
        down.kill()
        down = start_relay(tmp_path, "down", port=port)  # restarted empty, same address: no base there
        base = _pushed(uc, 4, states[3], base)
        wait_for(lambda: holds(dc, 4), 60, "the restarted relay holds version 4")
        info = dc.versions().versions[4]
        assert not info.delta and info.digest == base.digest  # forwarded whole, the same bits
        assert "lacks the base of delta 3 -> 4: forwarding version 4 whole" in up.log.read_text()
        with pytest.raises(RelayError) as err:  # a delta from a version the relay never held
            _pushed(dc, 5, states[4], Held(3, base.manifest, base.view, base.digest))
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION and "base version 3 is not held" in str(err.value)
        wrong = Held(4, base.manifest, base.view, "0" * 64)  # the right version number, another digest
        with pytest.raises(RelayError) as err:
            _pushed(uc, 5, states[4], wrong)
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION and "does not apply" in str(err.value)
        assert uc.versions().held == [3, 4] and 5 not in uc.versions().versions  # nothing of it kept
    finally:
        for c in (uc, dc):
            c.close()
        for r in (up, down):
            r.stop()


def test_a_restarted_master_takes_the_next_version_whole(tmp_path: Path):
    master = start_relay(tmp_path, "m")
    client = RelayClient(master.address)
    cfg = WeightsConfig(chunk_bytes=CHUNK, shm=False, heartbeat_s=0.1, heartbeat_timeout_s=1.0, delta=True,
                        dtype="bfloat16")
    transport = RelayTransport(cfg, relays=[master.address])
    states = versions(3, seed=2)
    try:
        for v in (1, 2):
            transport.publish(v, transport.snapshot(states[v - 1]))
            wait_for(lambda v=v: v in transport.sent, 60, f"version {v} pushed")
        port = int(master.address.rsplit(":", 1)[1])
        master.kill()
        master = start_relay(tmp_path, "m", port=port)
        transport.publish(3, transport.snapshot(states[2]))
        wait_for(lambda: 3 in transport.sent, 60, "version 3 pushed")
        assert [transport.sent[v]["sent"] for v in (1, 2, 3)] == ["whole", "delta", "fallback"]
        assert "base version 2 is not held" in transport.sent[3]["fallback"]
        assert transport.delta_counts() == {"delta": 1, "whole": 1, "fallback": 1}
        assert client.versions().versions[3].digest == transport.sent[3]["digest"]
    finally:
        transport.close()
        client.close()
        master.stop()


def test_an_instance_takes_deltas_and_a_version_it_has_no_base_for_whole(tmp_path: Path, tiny_checkpoint):
    from services.common.types import GenerateParams, PromptSpec
    from services.generation.client import GenerationClient
    from services.policy.model import load_policy

    relay = start_relay(tmp_path, "site", "--no-shm")  # as on another host: every pull crosses the network
    sgs = start_sgs_with_relay(tmp_path, tiny_checkpoint, relay.address, ("weights.sgs_auto_pull_s=0",
                                                                           "weights.delta=true"))
    client, pusher = GenerationClient(sgs.address), RelayClient(relay.address)
    state = {k: v.clone() for k, v in load_policy(tiny_checkpoint).model.state_dict().items()}
    try:
        client.wait_ready()
        base = None
        for v in range(1, 7):
            for t in state.values():  # a sparse step: one element in 50 moves (float32 deltas pay only so)
                t.view(-1)[v::50] += 1e-3
            base = _pushed(pusher, v, state, None if v in (1, 5) else base, dtype="float32")  # 5 goes whole
            if v <= 2:  # the first version comes whole (no base yet: counted), the next as a delta
                ack = client.pull_weights(v, wait_s=10)
                assert ack.staged and ack.path == ("tcp" if v == 1 else "delta+tcp")
                assert ack.delta_fallback == (v == 1) and ("held no version yet" in ack.fallback_reason) == (v == 1)
            if v == 4:  # it holds 2: the relay composes the deltas 2 -> 3 -> 4 into one
                ack = client.pull_weights(4, wait_s=10)
                assert ack.staged and ack.path == "delta+tcp" and not ack.delta_fallback
        ack = client.pull_weights(6, wait_s=10)  # it holds 4; version 5 came whole: no chain from 4
        assert ack.staged and ack.version == 6 and ack.path == "tcp" and ack.delta_fallback
        assert "no delta from version 4 to 6" in ack.fallback_reason
        out = list(client.generate([PromptSpec("p", (1, 5, 6))], GenerateParams(2, 4, min_weight_version=6)))
        assert len(out) == 2 and all(s.weight_version == 6 for s in out)
    finally:
        client.close()
        pusher.close()
        stop_sgs(sgs)
        relay.stop()
