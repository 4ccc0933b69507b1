"""bench/real_model.py's statistics on hand-made answers: the paired gain and its standard error."""

from __future__ import annotations

import math

import pytest

from bench.real_model_eval import Answer, by_family, length_stats, paired_gain


def _answers(correct: dict[str, list[bool]], family: str = "f") -> list[Answer]:
    return [Answer(pid, family, c, 10 * (i + 1), [], [], []) for pid, cs in correct.items() for i, c in enumerate(cs)]


def test_the_gain_is_paired_per_question_with_its_standard_error():
    before = _answers({"a": [False, False], "b": [True, False], "c": [True, True], "d": [False, False]})
    after = _answers({"a": [True, True], "b": [True, True], "c": [True, True], "d": [False, True]})
    g = paired_gain(before, after)
    diffs = [1.0, 0.5, 0.0, 0.5]  # per question: after's share correct minus before's
    se = math.sqrt(sum((d - 0.5) ** 2 for d in diffs) / 3) / 2
    assert g["heldout_before"] == pytest.approx(0.375) and g["heldout_after"] == pytest.approx(0.875)
    assert (g["gain"] == pytest.approx(0.5) and g["gain_stderr"] == pytest.approx(se)
            and g["gain_se"] == pytest.approx(0.5 / se))
    with pytest.raises(ValueError, match="different questions"):
        paired_gain(before, after[:-2])


def test_families_and_lengths():
    answers = _answers({"a": [True, False]}, "add") + _answers({"b": [True]}, "mul")
    assert by_family(answers) == {"add": {"n": 2, "accuracy": 0.5}, "mul": {"n": 1, "accuracy": 1.0}}
    stats = length_stats(answers)
    assert stats["length_p50"] == 10 and stats["length_max"] == 20
