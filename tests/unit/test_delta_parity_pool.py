"""Pooling issue 56's parity pairs (``bench/weights_delta_parity_pool.py``): which pairs join, which
are dropped and why, and the rule judged on the runs' own spread."""

from __future__ import annotations

import json
import math

import pytest

from bench import weights_delta_parity_pool as P
from bench.weights_delta_parity import COMMON, MODES, PARITY_SE
from bench.weights_delta_parity_bf16 import ARM


def _entry(whole: float, delta: float, date: str, commit: str = "a" * 40, **kw) -> dict:
    runs = {m: {"warmstart_accuracy": 0.192, "final_accuracy": f, "accuracy_stderr": 0.02, "eval_prompts": 500,
                "rl_seconds": 1700.0} for m, f in (("whole", whole), ("delta", delta))}
    return {"runs": runs, "judged": {"difference_in_se": (delta - whole) / 0.03}, "modes": MODES,
            "common": COMMON, "parity_se": PARITY_SE, "quick": False,
            "provenance": {"commit": commit, "date": date}, **kw}


def _bf16(finals: list[float], started: str, commit: str = "a" * 40, **kw) -> dict:
    runs = [{"warmstart_accuracy": 0.192, "final_accuracy": f, "accuracy_stderr": 0.02, "eval_prompts": 500,
             "rl_seconds": 1400.0, "wall_s": 1700.0} for f in finals]
    return {"runs": runs, "arm": ARM, "common": COMMON, "quick": False, "started": started,
            "provenance": {"commit": commit, "date": f"{started}-end"}, **kw}


def _pool(pairs: dict, left: dict, bf16: dict | None = None, bf16_left: dict | None = None) -> dict:
    bf16 = bf16 or {}
    return {"pairs": pairs, "left_out": left, "judged": P.judge_pool(pairs), "summary": "s",
            "bf16_runs": bf16, "bf16_left_out": bf16_left or {}, "judged_bf16": P.judge_bf16(pairs, bf16),
            "provenance": {"commit": "c" * 40, "dirty": False, "config_hash": "h", "date": "2026-11-30",
                           "machine": {"cpu": "cpu", "cores": 2, "mem_gb": 24.0}, "versions": {}}}


def fresh(prov: dict) -> list[str]:
    return []


def test_fresh_pairs_join_once_and_others_are_left_out_with_why():
    good = _entry(0.62, 0.70, "d1")
    quick = _entry(0.6, 0.6, "d2", quick=True)
    other = _entry(0.6, 0.6, "d3", common=["eval.suites=[]", "trainer.iterations=2"])
    no_final = _entry(0.6, 0.6, "d4")
    no_final["runs"]["delta"]["final_accuracy"] = None
    pairs, left = P.merge({}, [good, quick, other, no_final, json.loads(json.dumps(good))], fresh)
    assert list(pairs) == [P.pair_id(good)]  # the same pair offered twice (from two files) counts once
    assert left == {P.pair_id(quick): "a quick run",
                    P.pair_id(other): "other modes or settings than bench/weights_delta_parity.py's now",
                    P.pair_id(no_final): "a run without its final accuracy"}
    assert pairs[P.pair_id(good)]["runs"]["delta"]["final_accuracy"] == 0.70


def test_a_pair_whose_code_changed_is_dropped_from_the_pool_with_the_reason():
    def stale_b(prov: dict) -> list[str]:
        return ["code on its measured path changed since bbbbbbbb: services"] if prov["commit"][0] == "b" else []

    pooled, _ = P.merge({}, [_entry(0.6, 0.6, "d1"), _entry(0.7, 0.7, "d2", commit="b" * 40)], fresh)
    pairs, left = P.merge(pooled, [], stale_b)
    assert [p["provenance"]["date"] for p in pairs.values()] == ["d1"]
    assert left == {f"{'b' * 8}@d2": "code on its measured path changed since bbbbbbbb: services"}


def test_below_three_runs_a_mode_the_pool_is_not_judged():
    pairs, _ = P.merge({}, [_entry(0.618, 0.700, "d1"), _entry(0.692, 0.604, "d2")], fresh)
    j = P.judge_pool(pairs)
    assert j["judged"] is False and "2 run(s) a mode" in j["why"] and "parity" not in j
    assert j["mean"]["whole"] == pytest.approx(0.655) and j["spread"]["delta"]["max"] == 0.700


def test_the_rule_uses_the_runs_spread_not_the_evaluations_error():
    # each pair's own reading is far outside 1 eval s.e. (0.03), both ways; the runs' spread says the
    # modes do not differ
    finals = [(0.618, 0.700), (0.692, 0.604), (0.674, 0.680)]
    pairs, _ = P.merge({}, [_entry(w, d, f"d{i}") for i, (w, d) in enumerate(finals)], fresh)
    j = P.judge_pool(pairs)
    whole, delta = [w for w, _ in finals], [d for _, d in finals]
    se = math.sqrt(sum((sum((x - sum(v) / 3) ** 2 for x in v) / 2) / 3 for v in (whole, delta)))
    assert j["judged"] and j["se_of_difference"] == pytest.approx(se)
    assert j["difference"] == pytest.approx(sum(delta) / 3 - sum(whole) / 3)
    assert j["parity"] is (abs(j["difference"]) <= se) and j["parity"]
    assert [round(x, 2) for x in j["pairs_own_difference_in_se"]] == [2.73, -2.93, 0.2]


def test_a_clear_difference_beyond_the_spread_misses_parity():
    pairs, _ = P.merge({}, [_entry(0.60 + e, 0.70 + e, f"d{i}") for i, e in enumerate((0.0, 0.01, -0.01))], fresh)
    j = P.judge_pool(pairs)
    assert j["judged"] and not j["parity"] and not j["within_2_se"] and j["difference_in_se"] > 10


def test_the_markdown_says_not_judged_yet_and_lists_what_was_left_out():
    pairs, left = P.merge({}, [_entry(0.618, 0.700, "d1"), _entry(0.6, 0.6, "d2", quick=True)], fresh)
    text = P.markdown(_pool(pairs, left))
    assert "**Not judged yet**: 1 run(s) a mode; the rule needs 3." in text
    assert f"left out: {'a' * 8}@d2: a quick run" in text and "| 0.618 ± 0.020 | 0.700 ± 0.020 | +2.73 |" in text


def test_a_pair_offered_again_is_taken_anew_and_a_stale_offer_leaves_the_pooled_one_alone():
    old = _entry(0.62, 0.70, "d1")
    pooled, _ = P.merge({}, [old], fresh)
    again = json.loads(json.dumps(old))
    again["runs"]["whole"]["curve"] = [0.1, 0.2]
    pairs, left = P.merge(pooled, [again], fresh)
    assert list(pairs) == [P.pair_id(old)] and not left
    assert pairs[P.pair_id(old)]["runs"]["whole"]["curve"] == [0.1, 0.2]
    other_settings = {**json.loads(json.dumps(old)), "parity_se": 2.0}
    pairs, left = P.merge(pooled, [other_settings], fresh)
    assert pairs == pooled and not left


def test_the_plot_draws_each_pair_and_each_curve(tmp_path):
    entries = [_entry(0.62, 0.70, "d1"), _entry(0.64, 0.67, "d2")]
    for e in entries:
        for r in e["runs"].values():
            r["curve"] = [0.1, 0.3, 0.2, 0.5]
    pairs, _ = P.merge({}, entries, fresh)
    bf16 = _bf16([0.75, 0.70], "s1")
    for r in bf16["runs"]:
        r["curve"] = [0.2, 0.3, 0.4, 0.5]
    pool, _ = P.merge({}, [bf16], fresh, accept=P.why_not_bf16, keep=P.as_bf16)
    P.plot(_pool(pairs, {}, pool), tmp_path / "pool.png")
    assert (tmp_path / "pool.png").stat().st_size > 10_000


def test_bf16_invocations_join_by_their_start_and_others_are_left_out_with_why():
    partial = _bf16([0.75], "s1")  # written after its first run, then again after its third
    done = {**_bf16([0.75, 0.70, 0.72], "s1"), "provenance": {"commit": "a" * 40, "date": "later"}}
    quick = _bf16([0.5], "s2", quick=True)
    other = _bf16([0.5], "s3", arm=["weights.dtype=float16"])
    pooled, left = P.merge({}, [partial, quick, other], fresh, accept=P.why_not_bf16, keep=P.as_bf16)
    pooled, left2 = P.merge(pooled, [done], fresh, accept=P.why_not_bf16, keep=P.as_bf16)
    assert list(pooled) == [f"{'a' * 8}@s1"] and not left2
    assert [r["final_accuracy"] for r in pooled[f"{'a' * 8}@s1"]["runs"]] == [0.75, 0.70, 0.72]
    assert "wall_s" not in pooled[f"{'a' * 8}@s1"]["runs"][0]
    assert left == {f"{'a' * 8}@s2": "a quick run",
                    f"{'a' * 8}@s3": "other settings than bench/weights_delta_parity_bf16.py's now"}
    assert P.why_not_bf16({**done, "runs": []}) == "no runs"


def test_deltas_are_judged_against_whole_bf16_runs_by_the_same_rule():
    pairs, _ = P.merge({}, [_entry(0.618, 0.700, "d1"), _entry(0.642, 0.668, "d2"), _entry(0.632, 0.758, "d3")],
                       fresh)
    few, _ = P.merge({}, [_bf16([0.756, 0.70], "s1")], fresh, accept=P.why_not_bf16, keep=P.as_bf16)
    assert P.judge_bf16(pairs, few)["judged"] is False
    bf16, _ = P.merge({}, [_bf16([0.756, 0.70], "s1"), _bf16([0.72], "s2", commit="b" * 40)], fresh,
                      accept=P.why_not_bf16, keep=P.as_bf16)
    j = P.judge_bf16(pairs, bf16)
    assert j["finals"]["whole_bf16"] == [0.756, 0.70, 0.72] and j["judged"]
    assert j == {**j, **P.compare([0.756, 0.70, 0.72], [0.700, 0.668, 0.758])}
    assert j["difference"] == pytest.approx((0.700 + 0.668 + 0.758 - 0.756 - 0.70 - 0.72) / 3)
    assert j["parity"]  # spreads of about 0.045 and 0.028 against a difference of -0.017
    text = P.markdown(_pool(pairs, {}, bf16, {"x@s9": "a quick run"}))
    assert "## At the serving dtype" in text and "| aaaaaaaa@s1 | 0.756 ± 0.020, 0.700 ± 0.020 | 1400, 1400 |" in text
    assert "- left out: x@s9: a quick run" in text and "Means: whole_bf16 0.725, delta 0.709" in text


def test_the_pool_closes_at_its_declared_size_and_a_pooled_entry_keeps_its_place():
    pairs, _ = P.merge({}, [_entry(0.6 + i / 100, 0.7, f"d{i}") for i in range(P.CLOSED_AT)], fresh)
    more, left = P.merge(pairs, [_entry(0.5, 0.5, "late")], fresh)
    assert more == pairs and left == {f"{'a' * 8}@late": P.CLOSED}
    again, left = P.merge(pairs, [_entry(0.6, 0.7, "d0")], fresh)  # offered again: taken anew, no new run
    assert list(again) == list(pairs) and not left
    bf16, _ = P.merge({}, [_bf16([0.7] * (P.CLOSED_AT - 1), "s1")], fresh, accept=P.why_not_bf16, keep=P.as_bf16)
    grown = _bf16([0.7] * (P.CLOSED_AT + 1), "s1")  # the same invocation, past the size: stays as pooled
    kept, left = P.merge(bf16, [grown, _bf16([0.6], "s2")], fresh, accept=P.why_not_bf16, keep=P.as_bf16)
    assert [len(b["runs"]) for b in kept.values()] == [P.CLOSED_AT - 1, 1] and not left
    _, left = P.merge(kept, [_bf16([0.6], "s3")], fresh, accept=P.why_not_bf16, keep=P.as_bf16)
    assert left == {f"{'a' * 8}@s3": P.CLOSED}


def test_the_page_gives_the_order_the_invocations_ran_in_and_whether_the_pool_is_closed():
    pairs, _ = P.merge({}, [_entry(0.6, 0.7, f"2026-11-30T0{i}") for i in range(3)], fresh)
    bf16, _ = P.merge({}, [_bf16([0.7, 0.6, 0.65], "2026-11-30T05")], fresh, accept=P.why_not_bf16, keep=P.as_bf16)
    text = P.markdown(_pool(pairs, {}, bf16))
    assert ("Ran in this order: pair aaaaaaaa, then pair aaaaaaaa, then pair aaaaaaaa, then whole bf16 aaaaaaaa "
            "(3 run(s)).") in text and "Runs an arm: whole 3, delta 3, whole bf16 3." in text and ": open." in text
    pairs, _ = P.merge(pairs, [_entry(0.6, 0.7, "2026-11-30T06")], fresh)
    bf16, _ = P.merge(bf16, [_bf16([0.7], "2026-11-30T04")], fresh, accept=P.why_not_bf16, keep=P.as_bf16)
    text = P.markdown(_pool(pairs, {}, bf16))
    assert "then whole bf16 aaaaaaaa (1 run(s)), then whole bf16 aaaaaaaa (3 run(s)), then pair" in text
    assert "**closed**: this is its final reading" in text
