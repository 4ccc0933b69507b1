import pytest

from services.common.types import SampleRecord
from services.trainer.batching import DynamicBatcher


def s(group: str, i: int) -> SampleRecord:
    return SampleRecord(group, group, i, (1,), (2,), (-0.1,), 0, "stop", 0.0, 0.0, 0.0)


def test_releases_micro_batch_as_soon_as_enough_groups_complete():
    b = DynamicBatcher(group_size=2, micro_batch_groups=2)
    assert b.add(s("a", 0)) is None
    assert b.add(s("b", 1)) is None
    assert b.add(s("a", 1)) is None  # group a complete, 1 of 2 groups
    out = b.add(s("b", 0))
    assert out is not None and [[x.sample_index for x in g] for g in out] == [[0, 1], [0, 1]]
    assert b.add(s("c", 0)) is None
    assert b.flush() is None and b.incomplete == 1


def test_flush_returns_remaining_complete_groups_and_rejects_duplicates():
    b = DynamicBatcher(group_size=1, micro_batch_groups=5)
    b.add(s("a", 0))
    assert [g[0].group_id for g in b.flush()] == ["a"]
    b2 = DynamicBatcher(group_size=2, micro_batch_groups=1)
    b2.add(s("x", 0))
    with pytest.raises(ValueError, match="duplicate"):
        b2.add(s("x", 0))
