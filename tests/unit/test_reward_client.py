"""RewardPool without workers that answer: membership changes are followed, calls end with a
clear retryable error instead of hanging, and a malformed membership file is named."""

from __future__ import annotations

import pytest

from services.reward.client import RewardError, RewardPool, read_membership, write_membership
from services.reward.protocol import RewardRequest

REQUEST = RewardRequest("r", "arith", 0, "247-9>200=", ("#193",), ())


def test_an_empty_or_unreachable_pool_fails_fast_with_a_retryable_error(tmp_path):
    members = tmp_path / "reward-workers.json"
    write_membership(members, 1, [])
    pool = RewardPool(membership=members, timeout_s=2.0, retries=1, backoff_s=0.0)
    with pytest.raises(RewardError) as err:
        pool.score(REQUEST)
    assert err.value.code == "UNAVAILABLE" and err.value.retryable and "no reward workers" in str(err.value)
    assert "after 2 attempts" in str(err.value)
    write_membership(members, 2, ["127.0.0.1:1"])  # nothing listens on port 1
    assert pool.workers() == ["127.0.0.1:1"] and pool.version == 2
    with pytest.raises(RewardError) as err:
        pool.score(REQUEST)
    assert err.value.code == "UNAVAILABLE" and "127.0.0.1:1" in str(err.value)
    write_membership(members, 3, [])
    assert pool.workers() == [] and pool.version == 3
    pool.close()


def test_pool_arguments_and_membership_files_are_checked(tmp_path):
    with pytest.raises(ValueError, match="either addresses or a membership file"):
        RewardPool()
    with pytest.raises(ValueError, match="either addresses or a membership file"):
        RewardPool(["a:1"], tmp_path / "m.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": "1", "workers": []}')
    with pytest.raises(ValueError, match=r"bad.json: expected"):
        read_membership(bad)
    assert RewardPool(["127.0.0.1:1", "127.0.0.1:2"]).workers() == ["127.0.0.1:1", "127.0.0.1:2"]
