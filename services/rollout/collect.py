"""Generate a fixed set of prompts once across the SGS instances (the held-out evaluation).

Each prompt goes where a fleet table's pick places it (``fleet.Fleet.acquire``: the least loaded live instance, counting
the samples it asks for), so the shares are as even as round robin and a GRPO group stays on one
instance; one Generate call per instance runs on a background thread and the samples are
yielded in completion order. A failed call fails the whole collection, naming the instance.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

from services.common.types import GenerateParams, PromptSpec, SampleRecord
from services.generation.client import GenerationClient
from services.rollout.fleet import Fleet

_END = object()


def collect(
    clients: list[GenerationClient], prompts: list[PromptSpec], params: GenerateParams
) -> Iterator[SampleRecord]:
    fleet = Fleet(capacity=1 << 30)  # a table of its own (issue 53: evaluation should pick on the run's)
    for k, client in enumerate(clients):
        fleet.join(f"{client.address}#{k}", live=True, version=0)
    shares: dict[int, list[PromptSpec]] = {}
    for spec in prompts:
        inst = fleet.acquire(None, lambda v: True, need=params.samples_per_prompt)
        shares.setdefault(inst.index, []).append(spec)
    events: queue.Queue = queue.Queue()

    def read(i: int, share: list[PromptSpec]) -> None:
        try:
            for sample in clients[i].generate(share, params):
                events.put(sample)
            events.put(_END)
        except BaseException as exc:  # noqa: BLE001 - surfaced to the consumer
            events.put(RuntimeError(f"generation on {clients[i].address} failed: {exc}"))

    for i, share in shares.items():
        threading.Thread(target=read, args=(i, share), name=f"collect-{params.tag}-{i}", daemon=True).start()
    expected, received, open_calls = len(prompts) * params.samples_per_prompt, 0, len(shares)
    while open_calls:
        item = events.get()
        if item is _END:
            open_calls -= 1
        elif isinstance(item, BaseException):
            raise item
        else:
            received += 1
            yield item
    if received != expected:
        raise RuntimeError(f"generation ended after {received} of {expected} samples")
