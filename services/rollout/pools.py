"""The data module (Laminar §3.1): prompt pool, partial-response pool, experience buffer.

- ``PromptPool`` supplies prompts in a fixed order; prompts of trajectories given up by rule
  (an instance lost, RollArt's bound) go back to the front so none is skipped.
- ``PartialResponsePool`` records every in-flight trajectory: prompt, tokens and log-probs
  generated so far (updated whenever a segment ends, e.g. at a partial-rollout interrupt),
  the oldest weight version (V_traj), the instance running it. If an instance dies, its
  trajectories are handed back with their progress so another instance can resume them.
- ``ExperienceBuffer`` holds finished, rewarded items until training takes them: a writer
  (``put``) and a sampler (``take``). Which items may be taken is decided by the caller (the
  staleness manager's Ready buffer in bounded mode); taking an item that was never written or
  was already taken is an error, never a silent skip. The choice among candidates and the
  eviction when full are pluggable (``Sampler``, ``Evictor``); FIFO is the default.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


class PoolError(ValueError):
    """A request that does not match the pool's contents (unknown, duplicate, not ready)."""


class PromptPool(Generic[T]):
    def __init__(self, source: Iterator[T]) -> None:
        self._source = source
        self._returned: deque[T] = deque()
        self.taken = 0

    def take(self) -> T:
        self.taken += 1
        return self._returned.popleft() if self._returned else next(self._source)

    def peek(self) -> T:
        """The prompt ``take`` hands out next, left in the pool."""
        if not self._returned:
            self._returned.append(next(self._source))
        return self._returned[0]

    def peek_many(self, n: int) -> list[T]:
        """The next ``n`` prompts ``take`` hands out, in order, left in the pool."""
        while len(self._returned) < n:
            self._returned.append(next(self._source))
        return list(self._returned)[:n]

    def put_back(self, item: T) -> None:
        """Return a prompt whose trajectory was given up; it is handed out next."""
        self._returned.append(item)

    def queued(self) -> list[T]:
        """Items drawn from the source but not handed out yet, in hand-out order (returned ones, then
        the rest of the current batch of a ``from_batches`` pool): with the source's own state, the
        pool's cursor (a recovery checkpoint saves both)."""
        return list(self._returned) + list(getattr(self._source, "pending", ()))

    @staticmethod
    def from_batches(batch: Callable[[int], list[T]], size: int, queued: list[T] | None = None) -> PromptPool[T]:
        """A pool over an endless source that yields ``batch(size)`` lists one item at a time;
        ``queued`` items are handed out first (a restored cursor)."""
        pool = PromptPool(_Batches(batch, size))
        pool._returned.extend(queued or ())
        return pool


class _Batches(Iterator[T]):
    """``batch(size)`` lists, one item at a time; ``pending``: the current list's items not yet taken."""

    def __init__(self, batch: Callable[[int], list[T]], size: int) -> None:
        self.batch, self.size = batch, size
        self.pending: deque[T] = deque()

    def __next__(self) -> T:
        if not self.pending:
            self.pending.extend(self.batch(self.size))
        return self.pending.popleft()


@dataclass(frozen=True)
class Partial:
    key: str  # trajectory key, e.g. "<group>/<sample index>"
    group: str
    sample_index: int
    prompt_token_ids: tuple[int, ...]
    version: int  # V_traj: oldest version allowed for any of its tokens
    instance: int
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    segments: int = 0  # segments finished so far (interrupts)
    first_version: int = -1  # version of the first segment actually generated


class PartialResponsePool:
    def __init__(self) -> None:
        self._items: dict[str, Partial] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def get(self, key: str) -> Partial:
        if key not in self._items:
            raise PoolError(f"no in-flight trajectory {key!r}")
        return self._items[key]

    def start(self, item: Partial) -> None:
        if item.key in self._items:
            raise PoolError(f"trajectory {item.key!r} is already in flight")
        self._items[item.key] = item

    def extend(self, key: str, token_ids: tuple[int, ...], logprobs: tuple[float, ...], version: int) -> Partial:
        """Record a finished segment (e.g. interrupted by partial rollout) generated on ``version``."""
        if len(token_ids) != len(logprobs):
            raise PoolError(f"trajectory {key!r}: {len(token_ids)} tokens but {len(logprobs)} log-probs")
        p = self.get(key)
        first = p.first_version if p.first_version >= 0 else version
        updated = replace(
            p, token_ids=p.token_ids + token_ids, logprobs=p.logprobs + logprobs, segments=p.segments + 1,
            first_version=first,
        )
        self._items[key] = updated
        return updated

    def move(self, key: str, instance: int) -> Partial:
        """The trajectory continues on another instance (resume or migration)."""
        self._items[key] = replace(self.get(key), instance=instance)
        return self._items[key]

    def finish(self, key: str) -> Partial:
        return self._items.pop(self.get(key).key)

    def drop_group(self, group: str) -> list[Partial]:
        dropped = [p for p in self._items.values() if p.group == group]
        for p in dropped:
            del self._items[p.key]
        return dropped

    def on_instance(self, instance: int) -> list[Partial]:
        """Trajectories running on ``instance`` (e.g. to resume elsewhere when it dies)."""
        return [p for p in self._items.values() if p.instance == instance]

    def in_flight(self) -> list[Partial]:
        return list(self._items.values())


class Sampler(Protocol[T]):
    def choose(self, candidates: list[tuple[str, T]], n: int) -> list[str]:
        """Pick ``n`` keys among the candidates (oldest write first)."""
        ...


class FifoSampler:
    def choose(self, candidates: list[tuple[str, object]], n: int) -> list[str]:
        return [k for k, _ in candidates[:n]]


@dataclass
class PrioritySampler(Generic[T]):
    """Highest ``priority(item)`` first (ties: oldest first)."""

    priority: Callable[[T], float]

    def choose(self, candidates: list[tuple[str, T]], n: int) -> list[str]:
        ranked = sorted(enumerate(candidates), key=lambda ic: (-self.priority(ic[1][1]), ic[0]))
        return [k for _, (k, _) in ranked[:n]]


class Evictor(Protocol[T]):
    def victim(self, items: OrderedDict[str, T]) -> str: ...


class EvictOldest:
    def victim(self, items: OrderedDict[str, object]) -> str:
        return next(iter(items))


@dataclass
class ExperienceBuffer(Generic[T]):
    capacity: int = 1 << 20
    sampler: Sampler = field(default_factory=FifoSampler)
    evictor: Evictor = field(default_factory=EvictOldest)
    _items: OrderedDict[str, T] = field(default_factory=OrderedDict)
    evicted: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def put(self, key: str, item: T) -> None:
        """Writer: store a finished item; evicts (and records) victims when full."""
        if key in self._items:
            raise PoolError(f"experience {key!r} was already written")
        while len(self._items) >= self.capacity:
            victim = self.evictor.victim(self._items)
            del self._items[victim]
            self.evicted.append(victim)
        self._items[key] = item

    def get(self, key: str) -> T:
        """Read an item without removing it."""
        if key not in self._items:
            raise PoolError(f"experience {key!r} not ready (never written or already taken)")
        return self._items[key]

    def take(self, keys: list[str]) -> list[T]:
        """Sampler side: remove and return exactly these items (all must be present)."""
        missing = [k for k in keys if k not in self._items]
        if missing:
            raise PoolError(f"experience not ready (never written or already taken): {missing[:5]}")
        return [self._items.pop(k) for k in keys]

    def choose(self, keys: list[str], n: int) -> list[str]:
        """Let the sampler pick ``n`` of ``keys`` (all present), e.g. among a Ready buffer's entries."""
        missing = [k for k in keys if k not in self._items]
        if missing:
            raise PoolError(f"experience not ready (never written or already taken): {missing[:5]}")
        chosen = self.sampler.choose([(k, self._items[k]) for k in keys], n)
        if len(chosen) != n or not set(chosen) <= set(keys):
            raise PoolError(f"sampler returned {chosen[:5]}... which is not {n} of the {len(keys)} ready items")
        return chosen
