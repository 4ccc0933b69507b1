"""The data module: prompt pool, partial-response pool, experience buffer."""

from __future__ import annotations

import itertools

import pytest

from services.rollout.pools import (
    EvictOldest,
    ExperienceBuffer,
    Partial,
    PartialResponsePool,
    PoolError,
    PrioritySampler,
    PromptPool,
)


def test_prompt_pool_hands_out_in_order_and_returned_prompts_first():
    counter = itertools.count()
    pool = PromptPool.from_batches(lambda n: [next(counter) for _ in range(n)], 3)
    assert [pool.take() for _ in range(4)] == [0, 1, 2, 3]
    pool.put_back(1)
    assert [pool.take(), pool.take()] == [1, 4]


def test_partial_pool_keeps_progress_across_segments_and_instances():
    pool = PartialResponsePool()
    pool.start(Partial("g/0", "g", 0, (1, 2), version=3, instance=0))
    pool.extend("g/0", (5, 6), (-0.1, -0.2), version=3)
    p = pool.extend("g/0", (7,), (-0.3,), version=4)
    assert p.token_ids == (5, 6, 7) and p.logprobs == (-0.1, -0.2, -0.3) and p.segments == 2 and p.first_version == 3
    assert p.version == 3  # V_traj stays the oldest
    assert pool.on_instance(0) == [p]
    pool.move("g/0", 1)
    assert pool.on_instance(0) == [] and pool.on_instance(1)[0].token_ids == (5, 6, 7)
    with pytest.raises(PoolError, match="already in flight"):
        pool.start(Partial("g/0", "g", 0, (1,), 0, 0))
    with pytest.raises(PoolError, match="2 tokens but 1 log-probs"):
        pool.extend("g/0", (1, 2), (-1.0,), version=4)
    assert pool.finish("g/0").segments == 2 and len(pool) == 0
    with pytest.raises(PoolError, match="no in-flight trajectory"):
        pool.finish("g/0")


def test_experience_buffer_fifo_priority_and_eviction():
    buf = ExperienceBuffer(capacity=3, evictor=EvictOldest())
    for k in "abcd":
        buf.put(k, ord(k))
    assert buf.evicted == ["a"] and len(buf) == 3
    assert buf.choose(["b", "c", "d"], 2) == ["b", "c"]  # FIFO
    with pytest.raises(PoolError, match="already written"):
        buf.put("b", 0)
    assert buf.take(["c"]) == [ord("c")]
    with pytest.raises(PoolError, match="not ready"):
        buf.take(["c"])
    with pytest.raises(PoolError, match="not ready"):
        buf.choose(["a", "b"], 1)
    prio = ExperienceBuffer(sampler=PrioritySampler(priority=lambda x: x))
    for k, v in zip("xyz", (1, 3, 2), strict=True):
        prio.put(k, v)
    assert prio.choose(["x", "y", "z"], 2) == ["y", "z"]


def test_a_sampler_that_returns_items_that_are_not_ready_is_refused():
    class Bad:
        def choose(self, candidates, n):
            return ["nope"] * n

    buf = ExperienceBuffer(sampler=Bad())
    buf.put("a", 1)
    with pytest.raises(PoolError, match="not 1 of the 1 ready items"):
        buf.choose(["a"], 1)
