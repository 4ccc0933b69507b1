"""Generate a fixed set of prompts once across the SGS instances (the held-out evaluation).

Each prompt is placed on the run's fleet table (``fleet.evaluation_pick``): a live instance already
at the evaluated version (``params.min_weight_version``) with room for the samples it asks for
beside the work it holds, the least loaded first, so the shares are as even as round robin and a
GRPO group stays on one instance. What can be placed now goes out as one Generate call per
instance, on a background thread; each prompt's booking is released as its samples arrive, and the
prompts that found no room are placed as room frees (a full instance takes no evaluation share).
Samples are yielded in completion order. A failed call fails the whole collection, naming the
instance.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Iterator

from services.common.types import GenerateParams, PromptSpec, SampleRecord
from services.generation.client import GenerationClient
from services.rollout.fleet import Fleet, Reservation, evaluation_pick

_END = object()
WAIT_S = 600.0  # how long the prompts left may find no instance with room at the version
POLL_S = 0.05  # how often to look again for room while no call of this collection is open


def collect(clients: list[GenerationClient], prompts: list[PromptSpec], params: GenerateParams,
            fleet: Fleet) -> Iterator[SampleRecord]:
    """The samples of ``prompts`` (``params.samples_per_prompt`` each); ``fleet``: the table whose
    rows are ``clients``, index for index."""
    need, version = params.samples_per_prompt, params.min_weight_version
    pending = deque(prompts)
    booked: dict[str, list] = {}  # prompt id -> [its reservation, samples still to come]
    events: queue.Queue = queue.Queue()
    expected, received, open_calls = len(prompts) * need, 0, 0
    deadline = time.monotonic() + WAIT_S
    try:
        while pending or open_calls:
            open_calls += _place(clients, pending, booked, params, fleet, events)
            if not open_calls:  # every instance full or older: wait for room
                if time.monotonic() > deadline:
                    rows = "; ".join(f"{r.index} {r.state}{f' ({r.why[:200]})' if r.why else ''} v{r.version} "
                                     f"load {r.load}/{r.capacity}" for r in fleet.snapshot().rows)
                    raise RuntimeError(f"evaluation: {len(pending)} prompts found no live instance at version "
                                       f">= {version} with room for {need} samples in {WAIT_S:.0f} s ({rows})")
                time.sleep(POLL_S)
                continue
            item = events.get()
            if item is _END:
                open_calls -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                received += 1
                _returned(fleet, booked, item.prompt_id)
                yield item
    finally:
        for res, left in booked.values():
            fleet.release(res, left)
    if received != expected:
        raise RuntimeError(f"generation ended after {received} of {expected} samples")


def _place(clients, pending: deque, booked: dict, params: GenerateParams, fleet: Fleet,
           events: queue.Queue) -> int:
    """Book what fits now and start one call per instance; the calls started."""
    shares: dict[int, list[PromptSpec]] = {}
    while pending and (res := evaluation_pick(fleet, params.min_weight_version, params.samples_per_prompt)):
        spec = pending.popleft()
        booked[spec.prompt_id] = [res, res.samples]
        shares.setdefault(res.index, []).append(spec)
    for i, share in shares.items():
        threading.Thread(target=_read, args=(clients[i], share, params, events), daemon=True,
                         name=f"collect-{params.tag}-{i}").start()
    return len(shares)


def _read(client: GenerationClient, share: list[PromptSpec], params: GenerateParams, events: queue.Queue) -> None:
    try:
        for sample in client.generate(share, params):
            events.put(sample)
        events.put(_END)
    except BaseException as exc:  # noqa: BLE001 - surfaced to the consumer
        events.put(RuntimeError(f"generation on {client.address} failed: {exc}"))


def _returned(fleet: Fleet, booked: dict[str, list], prompt_id: str) -> None:
    entry = booked[prompt_id]
    res: Reservation = entry[0]
    fleet.release(res, 1)
    entry[1] -= 1
    if not entry[1]:
        del booked[prompt_id]
