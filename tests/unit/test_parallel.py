"""The pure parts of data parallelism: how groups are dealt to ranks, rank discovery, config rules."""

from __future__ import annotations

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.config import TrainerConfig
from services.trainer.parallel import ParallelContext, context_from_env, split_groups


def test_groups_go_largest_first_to_the_least_loaded_rank_in_arrival_order():
    sizes = [5, 9, 1, 4, 4]
    shares = split_groups(list(range(5)), 2, size=lambda g: sizes[g])
    # 9 -> rank 0; 5, 4 -> rank 1 (9 | 9); the tie sends the other 4 to rank 0; the 1 to rank 1 (13 | 10)
    assert shares == [[1, 4], [0, 2, 3]]
    assert split_groups([], 3, size=len) == [[], [], []]


@given(st.lists(st.integers(1, 500), max_size=40), st.integers(1, 8))
def test_every_group_goes_to_exactly_one_rank_and_loads_stay_within_one_group(sizes, world):
    shares = split_groups(list(range(len(sizes))), world, size=lambda g: sizes[g])
    dealt = [g for share in shares for g in share]
    assert sorted(dealt) == list(range(len(sizes)))  # none lost, none twice
    assert all(share == sorted(share) for share in shares)  # arrival order kept
    loads = [sum(sizes[g] for g in share) for share in shares]
    assert max(loads) - min(loads) <= max(sizes, default=0)  # greedy LPT: within the largest group


def test_the_rank_comes_from_torchruns_environment():
    assert context_from_env({}) is None and context_from_env({"WORLD_SIZE": "1"}) is None
    ctx = context_from_env({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"})
    assert ctx == ParallelContext(1, 2, 1) and not ctx.leader
    with pytest.raises(ValueError, match="outside WORLD_SIZE"):
        context_from_env({"WORLD_SIZE": "2", "RANK": "2"})


def test_ranks_refuse_what_is_not_sharded_yet():
    assert TrainerConfig(ranks=2, kl_coef=0.1).ranks == 2
    with pytest.raises(pydantic.ValidationError, match="PPO's critic is not sharded yet"):
        TrainerConfig(ranks=2, algorithm={"name": "ppo"})
