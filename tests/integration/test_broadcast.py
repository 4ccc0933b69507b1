"""Chained broadcast among relay processes: pipelining, a relay killed mid-broadcast, master
replacement, a restarted relay catching up (Laminar §4.2-4.3)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from services.common.config import WeightsConfig
from services.run.transport import RelayTransport
from services.weights.chain import RelayNode
from services.weights.client import RelayClient, snapshot_blob
from services.weights.controller import ChainController
from tests.integration.relays import holds, model_state, start_relay, wait_for

CHUNK = 16 * 1024


def test_relay_killed_mid_broadcast_survivors_end_byte_exact(tmp_path: Path):
    # r1 forwards slowly (30 ms per chunk), so killing it lands mid-broadcast to r2 and r3.
    relays = [start_relay(tmp_path, f"r{i}", faults="forward_delay_ms=30" if i == 1 else "") for i in range(4)]
    clients = [RelayClient(r.address) for r in relays]
    ctl = ChainController([RelayNode(r.address, "local") for r in relays], "local", heartbeat_s=0.1, timeout_s=1.0)
    try:
        ctl.start()
        assert ctl.plan.order() == [r.address for r in relays]
        state = model_state(5.0, scale=4)  # ~330 KB: ~20 chunks, ~0.6 s through the slow hop
        clients[0].push(snapshot_blob(state, CHUNK, None), 1)
        wait_for(lambda: clients[2].versions().versions.get(1) is not None, 30, "r2 starts receiving")
        assert not holds(clients[2], 1)  # mid-broadcast
        killed_at = time.monotonic()
        relays[1].kill()
        survivors = [clients[i] for i in (0, 2, 3)]
        wait_for(lambda: all(holds(c, 1) for c in survivors), 60, "survivors hold version 1")
        digests = {c.versions().versions[1].digest for c in survivors}
        assert len(digests) == 1
        for c in survivors:
            got = c.pull(1, allow_shm=False)
            assert all(torch.equal(got.state[k], state[k]) for k in state)
        wait_for(lambda: any(e["change"] == "dead" for e in ctl.events), 30, "controller cuts r1 out")
        dead = next(e for e in ctl.events if e["change"] == "dead")
        assert dead["relay"] == relays[1].address and dead["time"] >= time.time() - (time.monotonic() - killed_at) - 1
        assert ctl.plan.order() == [relays[i].address for i in (0, 2, 3)]
        # later versions follow the repaired chain
        clients[0].push(snapshot_blob(model_state(6.0, scale=4), CHUNK, None), 2)
        wait_for(lambda: all(holds(c, 2) for c in survivors), 60, "survivors hold version 2")
    finally:
        ctl.stop()
        for c in clients:
            c.close()
        for r in relays:
            r.stop()


def test_master_replaced_and_restarted_relay_catches_up(tmp_path: Path):
    relays = [start_relay(tmp_path, f"m{i}") for i in range(3)]
    clients = [RelayClient(r.address) for r in relays]
    cfg = WeightsConfig(chunk_bytes=CHUNK, streams=2, heartbeat_s=0.1, heartbeat_timeout_s=1.0, shm=False)
    transport = RelayTransport(cfg, relays=[r.address for r in relays])

    class Model(torch.nn.Module):
        def __init__(self, fill: float) -> None:
            super().__init__()
            for k, v in model_state(fill).items():
                self.register_buffer(k.replace(".", "_"), v)

    try:
        transport.publish(1, transport.snapshot(Model(1.0).state_dict()))
        wait_for(lambda: all(holds(c, 1) for c in clients), 60, "every relay holds version 1")
        relays[0].kill()  # the master
        wait_for(lambda: transport.controller.master == relays[1].address, 30, "a new master")
        transport.publish(2, transport.snapshot(Model(2.0).state_dict()))
        wait_for(lambda: all(holds(c, 2) for c in clients[1:]), 60, "survivors hold version 2")
        assert transport.pushed == 2
        port = int(relays[2].address.rsplit(":", 1)[1])
        relays[2].kill()
        wait_for(lambda: relays[2].address not in transport.controller.live(), 30, "m2 cut out")
        transport.publish(3, transport.snapshot(Model(3.0).state_dict()))
        wait_for(lambda: holds(clients[1], 3), 60, "master holds version 3")
        relays[2] = start_relay(tmp_path, "m2", port=port)  # restarted empty, same address
        wait_for(lambda: holds(clients[2], 3), 60, "the restarted relay catches up from its neighbour")
        got = clients[2].pull(3, allow_shm=False)
        assert all(bool((t == 3.0).all()) for t in got.state.values())
        assert [e["change"] for e in transport.controller.events] == ["dead", "dead", "revived"]
    finally:
        transport.close()
        for c in clients:
            c.close()
        for r in relays:
            r.stop()
