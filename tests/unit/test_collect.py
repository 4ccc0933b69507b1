"""The held-out evaluation's placement (services.rollout.collect) on the run's fleet table: real
versions and real capacity, so an evaluation share never lands on an instance that training filled
or that does not serve the evaluated version yet."""

from __future__ import annotations

import threading

import pytest

from services.common.types import GenerateParams, PromptSpec, SampleRecord
from services.rollout import collect as collect_mod
from services.rollout.collect import collect
from services.rollout.fleet import Fleet


class FakeClient:
    """Answers each prompt with ``samples_per_prompt`` samples; records the shares it was sent."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.shares: list[list[str]] = []
        self.lock = threading.Lock()

    def generate(self, prompts, params):
        with self.lock:
            self.shares.append([p.prompt_id for p in prompts])
        for p in prompts:
            for k in range(params.samples_per_prompt):
                yield SampleRecord(p.prompt_id, p.prompt_id, k, p.token_ids, (1,), (-0.1,), params.min_weight_version,
                                   "stop", 0, 0, 0)


def table(capacity: int, versions: list[int]) -> tuple[Fleet, list[FakeClient]]:
    fleet = Fleet(capacity)
    clients = [FakeClient(f"h:{k}") for k in range(len(versions))]
    for c, v in zip(clients, versions, strict=True):
        fleet.join(c.address, live=True, version=v)
    return fleet, clients


def prompts(n: int) -> list[PromptSpec]:
    return [PromptSpec(f"p{k}", (1, 2)) for k in range(n)]


def test_an_evaluation_share_never_lands_on_a_full_instance():
    fleet, clients = table(capacity=4, versions=[3, 3])
    training = fleet.reserve(0, 4)  # training filled instance 0
    params = GenerateParams(2, 0, 3, tag="eval")
    samples = list(collect(clients, prompts(5), params, fleet))
    assert len(samples) == 10 and {s.prompt_id for s in samples} == {f"p{k}" for k in range(5)}
    assert clients[0].shares == []  # full: no share
    assert all(len(share) <= 2 for share in clients[1].shares)  # 2 prompts x 2 samples fill instance 1
    assert sum(len(share) for share in clients[1].shares) == 5  # the rest went as room freed
    rows = fleet.snapshot()
    assert (rows[0].inflight, rows[1].inflight) == (4, 0)  # every evaluation booking released
    assert fleet.release(training)


def test_an_evaluation_runs_only_where_its_version_is():
    fleet, clients = table(capacity=8, versions=[2, 5])
    samples = list(collect(clients, prompts(3), GenerateParams(1, 0, 5, tag="eval"), fleet))
    assert len(samples) == 3 and clients[0].shares == []  # instance 0 does not serve version 5 yet


def test_with_no_instance_at_the_version_it_fails_naming_what_it_waited_for(monkeypatch):
    monkeypatch.setattr(collect_mod, "WAIT_S", 0.2)
    fleet, clients = table(capacity=8, versions=[1])
    with pytest.raises(RuntimeError, match="version >= 4"):
        list(collect(clients, prompts(1), GenerateParams(1, 0, 4, tag="eval"), fleet))
    assert fleet.snapshot()[0].inflight == 0
