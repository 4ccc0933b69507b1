"""bench/ranker_own.py's pure parts: the split by prompt, scoring against mean and first sample,
the split-half noise ceiling, and that bench/ranker.py keeps its part of ranker.json."""

from __future__ import annotations

import numpy as np

from bench import ranker_own


def rows(n: int) -> list[dict]:
    # question i's samples are around 10 * i: the longer questions are the later ones
    return [{"prompt": f"q{i}", "lengths": [10 * i + 1, 10 * i + 3, 10 * i + 2, 10 * i]} for i in range(n)]


def test_split_is_by_prompt_and_seeded():
    train, test = ranker_own.split(rows(40), 0.25, seed=0)
    assert len(test) == 10 and len(train) == 30
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert ranker_own.split(rows(40), 0.25, seed=0)[1] == test
    assert ranker_own.split(rows(40), 0.25, seed=1)[1] != test


def test_score_against_mean_and_first_sample():
    test = rows(20)
    perfect = np.array([np.mean(r["lengths"]) for r in test])
    s = ranker_own.score(perfect, test)
    assert s["recall_at_20"] == 1.0 and s["first_sample"]["recall_at_20"] == 1.0
    s = ranker_own.score(-perfect, test)  # ranks the tail last
    assert s["recall_at_20"] == 0.0 and s["spearman"] < -0.9


def test_noise_ceiling_is_perfect_without_noise_and_low_with_pure_noise():
    assert ranker_own.noise_ceiling(rows(20))["recall_at_20"] == 1.0
    rng = np.random.default_rng(0)
    noisy = [{"prompt": f"q{i}", "lengths": rng.integers(1, 500, size=4).tolist()} for i in range(400)]
    assert ranker_own.noise_ceiling(noisy)["recall_at_20"] < 0.45


def test_declared_regime_is_what_the_goal_reads():
    assert ranker_own.DECLARED["goal_recall_at_20"] == 0.70
    assert (ranker_own.DECLARED["samples_per_prompt"] >= 2
            and ranker_own.QUICK["prompts"] < ranker_own.DECLARED["prompts"])
