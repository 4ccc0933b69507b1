"""Drive many EnvManagers: trajectory-level (RollArt §5.3) or batch-level (the baseline).

Trajectory level: every manager runs its own loop (reset, then generate/step until done), at most
``concurrency`` at once, so a trajectory waiting on a slow environment never holds up another's
generation. Batch level: every trajectory generates turn k, then every environment steps turn k,
then turn k+1 begins (a barrier per phase, as batch-oriented frameworks interact). Both use the
same ``EnvManager`` objects and backends, so a benchmark compares only the schedule.

The gRPC clients are synchronous; ``ThreadedEnv`` and ``SgsGenerator`` run their calls on an
executor sized to the concurrency, so the event loop itself never blocks.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Literal, Protocol

import grpc

from services.agentic.client import EnvError
from services.agentic.manager import EnvBackend, EnvManager, Limits, TokenCodec
from services.agentic.protocol import StepOutcome
from services.agentic.sessions import EnvRequestError, SessionTable
from services.agentic.trajectory import Dropped, Trajectory
from services.common.types import GenerateParams, PromptSpec, SampleRecord
from services.rollout.fleet import Fleet, Reservation, fleet_of

Mode = Literal["trajectory", "batch"]


@dataclass(frozen=True)
class RolloutResult:
    mode: Mode
    trajectories: list[Trajectory]
    dropped: list[Dropped]
    wall_s: float


async def run_trajectory_level(managers: Sequence[EnvManager], concurrency: int,
                               clock: Callable[[], float] = time.monotonic) -> RolloutResult:
    gate = asyncio.Semaphore(concurrency)
    t0 = clock()

    async def one(m: EnvManager) -> None:
        async with gate:
            await m.run()

    async with asyncio.TaskGroup() as tg:
        for m in managers:
            tg.create_task(one(m))
    return await _collect("trajectory", managers, clock() - t0)


async def run_batch_level(managers: Sequence[EnvManager], clock: Callable[[], float] = time.monotonic) -> RolloutResult:
    t0 = clock()
    await _all(m.start() for m in managers)
    while active := [m for m in managers if not m.finished]:
        await _all(m.generate_turn() for m in active)
        await _all(m.step_env() for m in active)
    return await _collect("batch", managers, clock() - t0)


async def _all(coros) -> None:
    async with asyncio.TaskGroup() as tg:
        for c in coros:
            tg.create_task(c)


async def _collect(mode: Mode, managers: Sequence[EnvManager], wall_s: float) -> RolloutResult:
    await _all(m.wait_closed() for m in managers)
    results = [m.result() for m in managers]
    return RolloutResult(mode, [r for r in results if isinstance(r, Trajectory)],
                         [r for r in results if isinstance(r, Dropped)], wall_s)


def make_managers(specs: Sequence[tuple[str, int]], kind: str, backends: Sequence[EnvBackend], generator,
                  codec: TokenCodec, limits: Limits) -> list[EnvManager]:
    """One manager per (trajectory id, seed); trajectories go to the backends (workers) round robin."""
    if not backends:
        raise ValueError("no environment backends")
    return [EnvManager(tid, kind, seed, env=backends[i % len(backends)], generator=generator, codec=codec,
                       limits=limits)
            for i, (tid, seed) in enumerate(specs)]


class SyncEnv(Protocol):
    def reset(self, kind: str, seed: int, trajectory_id: str = "") -> tuple[str, str]: ...
    def step(self, session_id: str, turn: int, action: str, *, timeout_s: float | None = None) -> StepOutcome: ...
    def close(self, session_id: str) -> int: ...


class ThreadedEnv:
    """An ``EnvBackend`` over a synchronous client (``EnvClient`` or ``LocalEnv``), calls on ``executor``."""

    def __init__(self, client: SyncEnv, executor: Executor) -> None:
        self.client, self.executor = client, executor

    async def _run(self, fn, *args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(self.executor, lambda: fn(*args, **kwargs))

    async def reset(self, kind: str, seed: int, trajectory_id: str) -> tuple[str, str]:
        return await self._run(self.client.reset, kind, seed, trajectory_id)

    async def step(self, session_id: str, turn: int, action: str, timeout_s: float) -> StepOutcome:
        return await self._run(self.client.step, session_id, turn, action, timeout_s=timeout_s + 1.0)

    async def close(self, session_id: str) -> int:
        return await self._run(self.client.close, session_id)


class LocalEnv:
    """The worker's session table in this process, with the client's interface (tests, benchmarks
    without a worker process)."""

    def __init__(self, table: SessionTable) -> None:
        self.table = table

    def reset(self, kind: str, seed: int, trajectory_id: str = "") -> tuple[str, str]:
        return self._map(self.table.reset, kind, seed, trajectory_id)

    def step(self, session_id: str, turn: int, action: str, *, timeout_s: float | None = None) -> StepOutcome:
        return self._map(self.table.step, session_id, turn, action)

    def close(self, session_id: str) -> int:
        return self._map(self.table.close, session_id)

    @staticmethod
    def _map(fn, *args):
        try:
            return fn(*args)
        except EnvRequestError as err:
            raise EnvError(err.code, str(err)) from None


class SgsGenerator:
    """An ``ActionGenerator`` over SGS clients (instances, or one router): one Generate call (one
    sample) per turn, on the instance the fleet table picks and books (``services.rollout.fleet``:
    ``Fleet.acquire``, the staleness-aware pick every workflow uses): the least busy, preferring the
    instance that served the trajectory's previous turn (its prefix is cached there) unless that one
    is busier than the least busy by more than ``STICKY_SLACK`` calls; ``eligible`` narrows the
    choice to the instances of the task's pool (hardware affinity, when it talks to instances
    directly; a router applies it itself). Every prompt carries the task tag (the environment kind). A cancelled turn (a
    redundant trajectory no longer wanted) cancels its call on the SGS too. A turn's booking is
    released when its call returns; one that returns after its instance was lost (and perhaps
    readmitted) releases nothing: the loss began a new incarnation of the row.

    ``fleet``: the run's table, one row per client in order (instances that join at run time get
    rows and clients together, ``keeper.FleetKeeper``); by default a table of its own, every client
    live at version 0 with room for any number of turns (the SGS holds a turn until its instance
    has ``min_weight_version``, and the rollout's concurrency bounds what is in flight)."""

    STICKY_SLACK = 2
    STICKY_MEMORY = 65536  # trajectories whose last instance is remembered
    LOST_WAIT_S = 120.0  # how long every instance may be gone (restarting) before a turn fails

    def __init__(self, clients, executor: Executor, *, temperature: float = 0.0, tag: str = "agentic",
                 on_sample: Callable[[SampleRecord], None] | None = None,
                 eligible: Callable[[str, int], list[int]] | None = None, fleet: Fleet | None = None) -> None:
        # the caller's list itself: instances that join at run time (scale-out) are appended to it
        self.clients = (clients if isinstance(clients, list)
                        else list(clients) if isinstance(clients, tuple) else [clients])
        if not self.clients:
            raise ValueError("SgsGenerator needs at least one SGS client")
        self.executor = executor
        self.temperature, self.tag, self.on_sample = temperature, tag, on_sample
        self.eligible = eligible  # (task, clients) -> the client indices that may serve it (hardware affinity)
        if fleet is None:  # a table of its own
            fleet = fleet_of([getattr(c, "address", f"client-{k}") for k, c in enumerate(self.clients)], 1 << 30)
        self.fleet = fleet
        if len(self.fleet) != len(self.clients):
            raise ValueError(f"the fleet table has {len(self.fleet)} rows for {len(self.clients)} SGS clients")
        self._last: OrderedDict[str, int] = OrderedDict()
        self.lost_turns = 0  # turns re-run elsewhere because their instance went away

    def pick(self, trajectory_id: str, task: str = "") -> Reservation:
        """The client for the next turn of ``trajectory_id``, booked (in flight until ``release``)."""
        eligible = self.eligible(task, len(self.clients)) if self.eligible is not None else None
        prev = self._last.get(trajectory_id)
        inst = self.fleet.acquire(None, lambda v: True, eligible=eligible, prefer=prev, slack=self.STICKY_SLACK)
        if inst is None:
            raise RuntimeError(f"{trajectory_id}: no live SGS instance may serve task {task!r}")
        self._last[trajectory_id] = inst.index
        self._last.move_to_end(trajectory_id)
        while len(self._last) > self.STICKY_MEMORY:
            self._last.popitem(last=False)
        return inst

    async def generate(self, request_id: str, context: tuple[int, ...], max_new_tokens: int, *, min_version: int = 0,
                       task: str = "") -> SampleRecord:
        """The turn's sample. An instance that went away (UNAVAILABLE) is marked lost in the table
        and the turn runs again elsewhere from the same context (nothing of the trajectory is lost);
        with no instance alive it waits ``LOST_WAIT_S`` for one to be readmitted."""
        params = GenerateParams(samples_per_prompt=1, max_new_tokens=max_new_tokens, min_weight_version=min_version,
                                temperature=self.temperature, tag=self.tag)
        deadline = time.monotonic() + self.LOST_WAIT_S
        while True:
            if not self.fleet.live():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{request_id}: every SGS instance is gone")
                await asyncio.sleep(0.2)
                continue
            booked = self.pick(request_id.rsplit("/t", 1)[0], task)
            try:
                samples = await self._call(booked, request_id, context, task, params)
                break
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                self.fleet.mark_lost(booked.index, f"{request_id}: {err.details()}")
                self.lost_turns += 1
        if len(samples) != 1:
            raise RuntimeError(f"{request_id}: the SGS returned {len(samples)} samples for one")
        if self.on_sample is not None:
            self.on_sample(samples[0])
        return samples[0]

    async def _call(self, booked: Reservation, request_id: str, context: tuple[int, ...], task: str,
                    params: GenerateParams) -> list[SampleRecord]:
        call = None
        try:
            call = self.clients[booked.index].start([PromptSpec(request_id, context, task=task)], params)
            return await asyncio.get_running_loop().run_in_executor(self.executor, list, call)
        except asyncio.CancelledError:
            if call is not None:
                call.cancel()
            raise
        finally:
            self.fleet.release(booked)  # nothing when the instance was lost since (a new incarnation)


class PolicyCodec:
    """``TokenCodec`` of a ``Policy``: the first observation as a prompt (BOS), later ones alone."""

    def __init__(self, policy) -> None:
        self.policy = policy

    def encode_prompt(self, text: str) -> list[int]:
        return self.policy.encode_prompt(text)

    def encode_observation(self, text: str) -> list[int]:
        return [int(i) for i in self.policy.tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.policy.decode(ids)
