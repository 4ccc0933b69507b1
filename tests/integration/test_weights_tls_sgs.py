"""TLS on a relay's cross-site port, and an SGS instance pulling weights from its relay (full
weights, or with ``trainer.lora`` adapters only)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from services.common.certs import TlsFiles, make_certs
from services.policy.model import load_policy
from services.weights.client import RelayClient, RelayError, snapshot_blob
from tests.conftest import ROOT, stop_sgs
from tests.integration.relays import model_state, start_relay, start_sgs_with_relay, wait_for

CHUNK = 16 * 1024


def _sites(tmp_path: Path) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "sites.yaml"
    path.write_text(
        (ROOT / "deploy/sites/local-two-site.yaml").read_text()
        .replace("dir: .cache/certs", f"dir: {tmp_path / 'certs'}")
    )
    return path


def test_tls_link_refuses_unauthenticated_clients(tmp_path: Path):
    files = make_certs(_sites(tmp_path))
    assert set(files) == {"gen-site", "train-site"}
    relay = start_relay(tmp_path, "gen", "--tls-host", "127.0.0.1", "--tls-dir", str(tmp_path / "certs"),
                        "--site", "gen-site")
    try:
        trainer_side = RelayClient(relay.tls_address, tls=files["train-site"])  # mutual TLS, same CA
        assert trainer_side.push(snapshot_blob(model_state(1.0), CHUNK, None), 1, use_shm=False)
        assert trainer_side.versions().held == [1]
        trainer_side.close()
        anonymous = RelayClient(relay.tls_address)  # plaintext to the TLS port: no handshake
        with pytest.raises(grpc.RpcError) as err:
            anonymous.versions(timeout_s=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        other = make_certs(_sites(tmp_path / "other"), tmp_path / "other-certs")  # a certificate from another CA
        stranger = RelayClient(relay.tls_address, tls=TlsFiles(files["train-site"].ca, other["train-site"].cert,
                                                                other["train-site"].key))
        with pytest.raises(grpc.RpcError) as err:
            stranger.versions(timeout_s=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(RelayError):  # and pushes are refused too; what is held stays
            stranger.push(snapshot_blob(model_state(2.0), CHUNK, None), 2, use_shm=False)
        local = RelayClient(relay.address)  # the site's own loopback port stays plaintext
        assert local.versions().held == [1]
    finally:
        relay.stop()


def test_sgs_pulls_from_its_relay_when_told(tmp_path: Path, tiny_checkpoint):
    from services.common.types import GenerateParams, PromptSpec
    from services.generation.client import GenerationClient

    relay = start_relay(tmp_path, "local")
    sgs = start_sgs_with_relay(tmp_path, tiny_checkpoint, relay.address)
    client = GenerationClient(sgs.address)
    try:
        client.wait_ready()
        state = {k: v.clone().mul_(0) for k, v in load_policy(tiny_checkpoint).model.state_dict().items()}
        RelayClient(relay.address).push(snapshot_blob(state, CHUNK, Path("/dev/shm")), 1)
        ack = client.pull_weights(1, wait_s=10)  # told to (the instance may also have taken it on its own)
        assert ack.version == 1
        assert client.pull_weights(1).staged is False  # already has it: idempotent
        with pytest.raises(grpc.RpcError) as err:
            client.pull_weights(5, wait_s=0.5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND and "versions held: [1]" in err.value.details()
        out = list(client.generate([PromptSpec("p", (1, 5, 6))], GenerateParams(2, 4, min_weight_version=1)))
        assert len(out) == 2 and all(s.weight_version == 1 for s in out)
        RelayClient(relay.address).push(snapshot_blob(state, CHUNK, Path("/dev/shm")), 2)  # not told: between requests
        wait_for(lambda: client.health().weight_version == 2, 60, "the idle instance takes version 2 on its own")
        # told to pull a version the relay already evicted (the trainer pushed several while the
        # instance was busy): it takes the relay's newest instead of failing (and wedging its pusher)
        busy = client.start([PromptSpec("w", (1, 5, 6))], GenerateParams(1, 4, min_weight_version=99))
        wait_for(lambda: client.health().waiting == 1, 30,
                 "a waiting request keeps the instance from pulling on its own")
        pusher = RelayClient(relay.address)
        for v in (3, 4, 5, 6):
            pusher.push(snapshot_blob(state, CHUNK, Path("/dev/shm")), v)
        assert 3 not in pusher.versions().held
        ack = client.pull_weights(3)
        assert ack.version == 6 and ack.staged
        busy.cancel()
    finally:
        client.close()
        stop_sgs(sgs)
        relay.stop()


def test_control_calls_are_served_while_max_inflight_calls_wait_for_weights(tmp_path: Path, tiny_checkpoint):
    """Each open Generate call holds a server thread; with max_inflight calls waiting for a version
    only PullWeights can bring, PullWeights must still get a thread (it was a deadlock)."""
    from services.common.types import GenerateParams, PromptSpec
    from services.generation.client import GenerationClient

    relay = start_relay(tmp_path, "local")
    sgs = start_sgs_with_relay(tmp_path, tiny_checkpoint, relay.address, ("generation.max_inflight=20",))
    client = GenerationClient(sgs.address)
    try:
        client.wait_ready()
        calls = [client.start([PromptSpec(f"w{i}", (1, 5, 6))], GenerateParams(1, 3, min_weight_version=1))
                 for i in range(20)]
        wait_for(lambda: client.health().waiting == 20, 60, "20 calls wait for version 1")
        state = {k: v.clone() for k, v in load_policy(tiny_checkpoint).model.state_dict().items()}
        RelayClient(relay.address).push(snapshot_blob(state, CHUNK, Path("/dev/shm")), 1)
        assert client.pull_weights(1, wait_s=10).version == 1
        assert all(len(list(c)) == 1 for c in calls)
    finally:
        client.close()
        stop_sgs(sgs)
        relay.stop()


@pytest.mark.long  # `make test-long`; the fast tier keeps the shared-memory pull and the data channel's unit tests
def test_sgs_pulling_over_the_network_prefaults_its_next_receive_buffer(tmp_path: Path, tiny_checkpoint):
    """A relay without shared memory (as on another host): the SGS pulls over the data channel,
    then faults in the next version's buffer off the pull's path; the next pull lands in it."""
    from services.generation.client import GenerationClient

    relay = start_relay(tmp_path, "remote", "--no-shm")
    sgs = start_sgs_with_relay(tmp_path, tiny_checkpoint, relay.address, ("weights.sgs_auto_pull_s=0",))
    client = GenerationClient(sgs.address)
    pusher = RelayClient(relay.address)
    try:
        client.wait_ready()
        state = {k: v.clone() for k, v in load_policy(tiny_checkpoint).model.state_dict().items()}
        for v in (1, 2):
            pusher.push(snapshot_blob(state, CHUNK, None), v, use_shm=False)
            assert client.pull_weights(v, wait_s=10).staged
            wait_for(lambda v=v: sgs.log.read_text().count("pre-faulted a") == v, 30, f"the buffer after version {v}")
        log = sgs.log.read_text()
        assert "weight version 1 from relay" in log and "(tcp)" in log
        assert "weight version 2 from relay" in log and "(tcp, into a pre-faulted buffer)" in log
    finally:
        pusher.close()
        client.close()
        stop_sgs(sgs)
        relay.stop()


def test_adapter_serving_sgs_takes_adapters_pushed_and_pulled_and_refuses_full_weights(tmp_path: Path, tiny_checkpoint):
    """trainer.lora set: every version is the adapter's tensors, through PushWeights and through a
    relay pull, validated like full weights; a full-weights version is refused on either path saying
    why, and the instance keeps serving what it has. Greedy outputs are base + adapter merged's.
    (A relay keeps one model's parameters for life: a full-weights relay is replaced on its port by
    one that holds adapters.)"""
    from services.common.lora import LoraConfig
    from services.common.types import GenerateParams, PromptSpec
    from services.generation.client import GenerationClient
    from tests.integration.adapters import random_adapter, ref_greedy

    relay = start_relay(tmp_path, "local")
    sgs = start_sgs_with_relay(tmp_path, tiny_checkpoint, relay.address,
                                ("trainer.lora.rank=4", "trainer.lora.alpha=8", "weights.sgs_auto_pull_s=0"))
    client = GenerationClient(sgs.address)
    cfg, prompt, shm = LoraConfig(rank=4, alpha=8.0), (1, 5, 6, 7), Path("/dev/shm")

    def greedy(version: int) -> list[int]:
        [s] = client.generate([PromptSpec("p", prompt)],
                              GenerateParams(1, 12, temperature=1e-6, min_weight_version=version))
        assert s.weight_version == version
        return list(s.token_ids)

    def refused(call, *words: str) -> None:
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        assert all(w in err.value.details() for w in words), err.value.details()

    try:
        client.wait_ready()
        assert "LoRA adapter rank 4" in sgs.log.read_text()
        full = {k: v.clone() for k, v in load_policy(tiny_checkpoint).model.state_dict().items()}
        refused(lambda: client.update_weights(full, 1, chunk_bytes=CHUNK), "serves base + a LoRA adapter",
                "not full weights")
        v1, merged1 = random_adapter(tiny_checkpoint, cfg, 21)
        assert client.update_weights(v1, 1, chunk_bytes=CHUNK).staged  # PushWeights
        out1 = greedy(1)
        assert out1 == ref_greedy(merged1, list(prompt), len(out1))
        RelayClient(relay.address).push(snapshot_blob(full, CHUNK, shm), 2)  # full weights on the relay
        refused(lambda: client.pull_weights(2, wait_s=10), "different model's parameters",
                "serves base + a LoRA adapter")
        assert client.health().weight_version == 1 and greedy(1) == out1
        assert relay.stop() == 0
        relay = start_relay(tmp_path, "local", port=int(relay.address.rsplit(":", 1)[1]))  # now holding adapters
        v2, merged2 = random_adapter(tiny_checkpoint, cfg, 22)
        RelayClient(relay.address).push(snapshot_blob(v2, CHUNK, shm), 2)
        assert client.pull_weights(2, wait_s=10).staged  # PullWeights through the relay
        out2 = greedy(2)
        assert out2 == ref_greedy(merged2, list(prompt), len(out2)) and out2 != out1
    finally:
        client.close()
        stop_sgs(sgs)
        relay.stop()
