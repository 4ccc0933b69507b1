"""The learner's padded micro-batches as the training model prices them (``allocator.padding``)."""

from __future__ import annotations

import math
import random
import statistics
from types import SimpleNamespace

import pytest

from allocator.memory import ParallelConfig
from allocator.padding import (
    GROUP_CORRELATION,
    MICRO_BATCH_TOKENS,
    PaddedWork,
    backward_calls,
    completion_order,
    deal_groups,
    expected_work,
    length_buckets,
    micro_batch_work,
)
from allocator.training import TrainSite, TrainWorkload, padded_step_flops, step_flops, step_time
from services.generation.scheduling.hardware import get_hardware
from services.generation.scheduling.models import get_model


def test_the_allocator_prices_the_learners_own_bucketing_without_importing_torch():
    import subprocess
    import sys

    from services.common.trainer_config import TrainerConfig
    from services.trainer import learner

    # the learner buckets with the same function, at trainer.micro_batch_tokens (default: the allocator's)
    assert learner.length_buckets is length_buckets and TrainerConfig().micro_batch_tokens == MICRO_BATCH_TOKENS
    code = "import sys, allocator.padding, allocator.training; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_micro_batch_work_pads_each_bucket_to_its_longest():
    w = micro_batch_work([[10, 20, 10]])  # one bucket (3 x 20 <= 4096), width 20
    assert (w.sequences, w.tokens, w.attn_sq) == (3, 40, 100 + 400 + 100)
    assert (w.padded_tokens, w.padded_attn_sq, w.micro_batches, w.longest) == (60, 3 * 400, 1, 20)
    assert math.isclose(w.pad_factor, 1.5)
    # 5 x 1000 tokens: four fit in 4096, the fifth starts a new micro-batch; 5000 alone
    w = micro_batch_work([[1000] * 5, [5000]])
    assert (w.micro_batches, w.padded_tokens, w.pad_factor) == (3, 10_000, 1.0)
    # calls are bucketed separately: a short and a long call pad nothing, the same lengths in one call do
    assert micro_batch_work([[10, 10], [100, 100]]).pad_factor == 1.0
    assert micro_batch_work([[10, 100], [10, 100]]).pad_factor == pytest.approx(400 / 220)
    assert micro_batch_work([]) == PaddedWork(0, 0, 0.0, 0, 0.0, 0, 0)


def test_backward_calls_take_micro_batch_groups_at_a_time_remainder_last():
    groups = [[1, 2], [3], [4, 5], [6]]
    assert backward_calls(groups, 2) == [[1, 2, 3], [4, 5, 6]]
    assert backward_calls(groups, 3) == [[1, 2, 3, 4, 5], [6]]
    assert backward_calls(groups, 10) == [[1, 2, 3, 4, 5, 6]]
    with pytest.raises(ValueError, match="micro_batch_groups must be >= 1"):
        backward_calls(groups, 0)


def test_groups_complete_in_order_of_their_longest_and_deal_keeps_every_length():
    assert completion_order([[5, 50], [7, 8], [40, 1]]) == [[7, 8], [40, 1], [5, 50]]
    lengths = list(range(1, 20))
    groups = deal_groups(lengths, 4, random.Random(0))
    assert [len(g) for g in groups] == [4, 4, 4, 7] and sorted(n for g in groups for n in g) == lengths
    assert deal_groups([3, 1], 8, random.Random(0)) in ([[3, 1]], [[1, 3]])


def test_a_correlated_deal_makes_groups_of_similar_lengths():
    lengths = list(range(1, 65))
    runs = deal_groups(lengths, 8, random.Random(0), correlation=1.0)
    assert sorted(sorted(g) for g in runs) == [list(range(i, i + 8)) for i in range(1, 65, 8)]
    spread = {c: statistics.mean(max(g) - min(g) for seed in range(20)
                                 for g in deal_groups(lengths, 8, random.Random(seed), correlation=c))
              for c in (0.0, GROUP_CORRELATION, 1.0)}
    assert spread[1.0] == 7 < spread[GROUP_CORRELATION] < spread[0.0]
    with pytest.raises(ValueError, match="correlation must be in"):
        deal_groups(lengths, 8, random.Random(0), correlation=1.5)


def test_expected_padding_falls_with_the_groups_correlation():
    rng = random.Random(2)
    lengths = [11 + max(1, round(rng.lognormvariate(math.log(16), 0.9))) for _ in range(256)]
    pad = {c: expected_work(lengths, 8, 1, correlation=c).pad_factor for c in (0.0, GROUP_CORRELATION, 1.0)}
    assert pad[0.0] > pad[GROUP_CORRELATION] > pad[1.0] >= 1.0


def test_expected_work_is_deterministic_and_exact_when_grouping_cannot_matter():
    rng = random.Random(1)
    lengths = [11 + max(1, round(rng.lognormvariate(math.log(16), 0.9))) for _ in range(256)]
    a, b = expected_work(lengths, 8, 8), expected_work(lengths, 8, 8)
    assert a == b and a.tokens == sum(lengths) and a.longest == max(lengths) and a.pad_factor > 1.2
    # one call holds every sequence: bucketing sorts them, so any grouping gives the exact work
    one = micro_batch_work([lengths])
    full = expected_work(lengths, 8, 32)
    assert (full.padded_tokens, full.padded_attn_sq, full.micro_batches) == (one.padded_tokens, one.padded_attn_sq,
                                                                             one.micro_batches)
    # equal lengths: no padding whatever the grouping
    assert expected_work([40] * 64, 8, 1).pad_factor == 1.0
    with pytest.raises(ValueError):
        expected_work([], 8, 8)


def test_profile_prices_the_padded_work_and_the_roofline_the_useful_flops():
    model = get_model("braid-tiny")
    work = micro_batch_work([[12, 200, 12, 12]])
    wl = TrainWorkload.from_work(work)
    assert (wl.tokens, wl.mb_tokens, wl.padded_tokens) == (236, 200, 800)
    assert padded_step_flops(model, wl) == step_flops(model, TrainWorkload(800, 4 * 200.0 ** 2, 200))
    assert padded_step_flops(model, TrainWorkload(236, 1.0, 200)) == step_flops(model, TrainWorkload(236, 1.0, 200))
    hw, one = get_hardware("H800"), ParallelConfig(1, 1, 1)
    prof = SimpleNamespace(fixed_s=0.01, effective_flops=1e9)  # what step_time reads of a TrainProfile
    measured = step_time(model, one, TrainSite(hw, 8, 25.0, profile=prof), wl)  # type: ignore[arg-type]
    roof = step_time(model, one, TrainSite(hw, 8, 25.0), wl)
    assert measured.compute_s == padded_step_flops(model, wl) / 1e9 and measured.fixed_s == 0.01
    assert roof.compute_s == step_flops(model, wl) / (hw.bf16_tflops * 1e12 * 0.40)
