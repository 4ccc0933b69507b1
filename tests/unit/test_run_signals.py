"""RunLengths: per-prompt length estimates from a prior, the prompt's history and its finished siblings."""

from __future__ import annotations

import math
import random

import pytest

from ranker.metrics import recall_at
from services.generation.scheduling.run_signals import RunLengths, order_z


def _visit(est: RunLengths, key: str, identity: str, lengths: list[int], prior: float | None = None) -> None:
    est.start(key, identity, len(lengths), prior)
    for n in sorted(lengths):
        est.finished(key, n)
    est.close(key)


def test_order_statistics_are_symmetric_and_increasing():
    assert order_z(1, 1) == pytest.approx(0.0)
    zs = [order_z(i, 8) for i in range(1, 9)]
    assert zs == sorted(zs)
    assert zs[0] == pytest.approx(-zs[-1])
    assert zs[-1] == pytest.approx(1.42, abs=0.02)  # E[max of 8 normals] = 1.42
    with pytest.raises(ValueError):
        order_z(0, 4)


def test_nothing_known_is_no_estimate_then_the_run_mean():
    est = RunLengths()
    assert est.sample("a") is None and est.group_makespan("a", 8) is None
    _visit(est, "g0", "b", [100, 100])
    assert est.sample("a") == pytest.approx(100 * math.exp(0.5 ** 2 / 2))  # the run's mean, sigma given


def test_history_moves_the_estimate_and_the_recent_visit_counts_more():
    est = RunLengths(decay=0.5)
    _visit(est, "g0", "long", [400] * 4)
    _visit(est, "g1", "short", [40] * 4)
    assert est.sample("long", prior=100) > est.sample("short", prior=100)
    _visit(est, "g2", "drift", [400] * 4)
    _visit(est, "g3", "drift", [40] * 4)  # the policy moved: the newer visit weighs twice the older
    m = math.log(est.sample("drift")) - est.sigma ** 2 / 2
    assert m == pytest.approx((0.5 * 4 * math.log(400) + 4 * math.log(40)) / 6, abs=0.01)
    assert est.visits("drift") == 2 and est.visits("new") == 0


def test_siblings_correct_for_finishing_first():
    """The first k of G to finish are the shortest: their mean underestimates mu, the order-statistic
    correction does not (lognormal lengths, the spread known)."""
    rng = random.Random(0)
    mu, sigma, size, k = math.log(200), 0.6, 8, 2
    naive, corrected = [], []
    for t in range(400):
        est = RunLengths(sigma=sigma, prior_weight=0.0)
        lengths = sorted(max(1, round(math.exp(rng.gauss(mu, sigma)))) for _ in range(size))
        est.start(f"g{t}", "p", size)
        for n in lengths[:k]:
            est.finished(f"g{t}", n)
        corrected.append(est.mu(f"g{t}") - mu)
        naive.append(sum(math.log(n) for n in lengths[:k]) / k - mu)
    assert abs(sum(corrected) / len(corrected)) < 0.05
    assert sum(naive) / len(naive) < -0.5 * sigma


def test_remaining_and_makespan():
    est = RunLengths(sigma=0.5, prior_weight=0.0)
    est.start("g", "p", 4)
    assert est.remaining("g") == [] and est.makespan("g") is None
    est.finished("g", 300)
    rest = est.remaining("g")
    assert len(rest) == 3 and rest == sorted(rest) and rest[0] >= 300
    assert est.makespan("g") == rest[-1]
    for n in (310, 320, 900):
        est.finished("g", n)
    assert est.makespan("g") == pytest.approx(900)
    est.finished("g", 50)  # more samples than the group has: ignored
    assert est.makespan("g") == pytest.approx(900)


def test_a_prior_off_by_a_factor_is_corrected_and_the_cap_holds():
    est = RunLengths(prior_weight=1.0, max_tokens=512)
    for t in range(20):
        _visit(est, f"g{t}", f"p{t}", [100, 100], prior=400)  # the ranker says 4x too much
    assert est.sample("new", prior=400) == pytest.approx(100 * math.exp(est.sigma ** 2 / 2), rel=0.02)
    assert est.group_makespan("new", 8, prior=1e6) <= 512


def test_pooled_spread_is_learned():
    rng = random.Random(1)
    est = RunLengths(sigma=0.1, min_groups=8)
    for t in range(200):
        _visit(est, f"g{t}", f"p{t}", [max(1, round(math.exp(rng.gauss(5.0, 0.7)))) for _ in range(8)])
    assert est.sigma == pytest.approx(0.7, abs=0.05)


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        RunLengths(decay=1.5)
    with pytest.raises(ValueError):
        RunLengths(max_tokens=0)
    est = RunLengths()
    est.start("g", "p", 2)
    with pytest.raises(ValueError):
        est.start("g", "p", 2)
    with pytest.raises(ValueError):
        est.start("h", "p", 0)
    with pytest.raises(KeyError):
        est.mu("nope")
    est.finished("nope", 10)  # a sample of an unknown group is ignored
    est.close("nope")


def test_siblings_and_history_rank_group_makespans_better_than_a_noisy_prior():
    """Prompts with lasting length levels, a text prior that knows little of them: recall@20% of the
    groups' makespans rises with a visit's history and with a quarter of the group finished."""
    rng = random.Random(2)
    size, prompts = 8, 300
    level = {f"p{i}": rng.gauss(5.0, 0.5) for i in range(prompts)}
    prior = {p: math.exp(m + rng.gauss(0, 0.8)) for p, m in level.items()}  # weak text signal

    def draw(p: str) -> list[int]:
        return [max(1, round(math.exp(rng.gauss(level[p], 0.5)))) for _ in range(size)]

    est = RunLengths()
    for p in level:  # visit 1: history
        _visit(est, f"{p}/1", p, draw(p), prior=prior[p])
    truth, text, hist, sib, both = [], [], [], [], []
    fresh = RunLengths()  # the same run without history
    for p in level:  # visit 2: scored
        lengths = sorted(draw(p))
        truth.append(max(lengths))
        text.append(prior[p])
        hist.append(est.group_makespan(p, size, prior=prior[p]))
        est.start(f"{p}/2", p, size, prior[p])
        fresh.start(f"{p}/2", p, size, prior[p])
        for n in lengths[: size // 4]:
            est.finished(f"{p}/2", n)
            fresh.finished(f"{p}/2", n)
        sib.append(fresh.makespan(f"{p}/2"))
        both.append(est.makespan(f"{p}/2"))
    r_text, r_hist, r_sib, r_both = (recall_at(x, truth, 0.2) for x in (text, hist, sib, both))
    assert r_text < r_hist < r_both and r_text < r_sib < r_both
    assert r_both >= 0.5
