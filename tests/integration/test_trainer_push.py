"""A trained learner's weights reach a real relay process through the relay transport, drawn
tensor by tensor into the snapshot (``Learner.weights()``), and a pull gives them back exactly.
CPU here; ``tests/gpu`` runs the same check from a CUDA trainer in bfloat16."""

from __future__ import annotations

from pathlib import Path

import torch

from services.common.config import WeightsConfig
from services.run.transport import RelayTransport
from tests.integration.relays import running_relay, wait_for
from tests.unit.test_learner import _groups, _step
from tests.unit.test_trainer_device import _learner


def check_push_to_relay(tmp_path: Path, **trainer) -> None:
    learner = _learner(**trainer)
    start = learner.weights().host_copies()
    _step(learner, [_groups()])
    want = learner.weights().host_copies()
    assert any(not torch.equal(want[k], start[k]) for k in want)  # not vacuous: the step moved them
    with running_relay(tmp_path, "r0") as (relay, client):
        transport = RelayTransport(WeightsConfig(shm=False), relays=[relay.address])
        try:
            transport.publish(1, transport.snapshot(learner.weights()))
            wait_for(lambda: transport.pushed >= 1, 60, "version 1 pushed")
            transport.raise_if_failed()
            got = client.pull(1, allow_shm=False).state
        finally:
            transport.close()
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == torch.float32 and torch.equal(got[k], want[k]), k


def test_a_trained_learner_pushes_its_weights_to_a_relay(tmp_path):
    check_push_to_relay(tmp_path)
