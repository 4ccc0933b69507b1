"""bench/dispatch_train.py's pure parts: the replay rows made from the ranker's estimates file, and
the ratios of record against the best length-blind variant."""

from __future__ import annotations

import json

import pytest

from bench import dispatch_train as dt


def test_replay_rows_scale_lengths_and_estimates_alike(tmp_path):
    f = tmp_path / "est.jsonl"
    f.write_text("".join(json.dumps({"response_length": chars, "estimated_length": est}) + "\n"
                         for chars, est in [(8192, 4096.0), (40, 80.0), (100_000, 0.0)]))
    rows = dt.replay_rows(f, 256)
    # 8192 chars = 2048 tokens = the source cap -> our cap; estimates scaled by the same 256 / 2048 / 4
    assert rows[0] == {"length": 256, "estimate": pytest.approx(128.0)}
    assert rows[1]["length"] == 1 and rows[1]["estimate"] == pytest.approx(2.5)
    assert rows[2]["length"] == 256 and rows[2]["estimate"] > 0  # over the cap: clipped; estimate kept positive


def _runs(values: dict[str, list[float]]) -> dict[str, list[dict]]:
    return {n: [{"tokens_per_s": v, "samples_per_s": v / 10, "gen_span_s": 1.0} for v in vs]
            for n, vs in values.items()}


def test_ratios_are_against_the_best_length_blind_variant_per_round():
    s = dt.summarize(_runs({"pick": [100, 100, 100], "least_tokens": [110, 120, 100], "round_robin": [90, 90, 90],
                            "lpt+ranker": [121, 132, 110], "streamrl+ranker": [100, 100, 100],
                            "lpt+oracle": [110, 120, 100], "streamrl+oracle": [220, 240, 200]}))
    assert s["best_length_blind"] == "least_tokens"  # highest median (110), not the first listed
    assert s["best_ranker"] == "lpt+ranker" and s["ranker_vs_best_length_blind"]["median"] == pytest.approx(1.1)
    assert s["ranker_vs_best_length_blind"]["per_repeat"] == pytest.approx([1.1, 1.1, 1.1])
    assert s["goal_met"] is True
    assert s["best_oracle"] == "streamrl+oracle" and s["oracle_vs_best_length_blind"]["median"] == pytest.approx(2.0)
    lost = dt.summarize(_runs({"pick": [100, 100, 100], "lpt+ranker": [90, 95, 99]}))
    assert lost["goal_met"] is False and "oracle_vs_best_length_blind" not in lost


def test_every_variant_is_one_of_the_three_kinds():
    assert set(dt.VARIANTS) == set(dt.LENGTH_BLIND) | set(dt.RANKER) | set(dt.ORACLE)
    assert "least_tokens" in dt.LENGTH_BLIND and all("/" not in n for n in dt.VARIANTS)  # names are run dirs


def test_the_regime_of_record_is_where_the_oracle_pays_most_and_every_regime_is_rendered():
    regimes = {
        "sync": {"summary": dt.summarize(_runs({"pick": [100, 100, 100], "lpt+ranker": [90, 95, 99],
                                                "lpt+oracle": [130, 120, 125]}))},
        "one_step": {"summary": dt.summarize(_runs({"pick": [100, 100, 100], "lpt+ranker": [104, 100, 101],
                                                    "lpt+oracle": [105, 101, 103]}))},
    }
    assert dt.regime_of_record(regimes) == "sync"  # 1.25x beats 1.03x, whatever the ranker did
    assert dt.regime_of_record({"one_step": {"summary": dt.summarize(_runs({"pick": [1, 1, 1]}))}}) is None
    prov = {"commit": "0" * 40, "dirty": False, "config_hash": "x", "date": "d", "versions": {},
            "machine": {"cpu": "c", "cores": 2, "mem_gb": 8}}
    text = dt.markdown({"regimes": regimes, "regime_of_record": "sync", "rule": "r", "provenance": prov,
                        "settings": {"rounds": 3, "note": "n"}})
    assert "## sync" in text and "## one_step" in text and "goal 1.1x **missed**" in text


def test_a_run_keeps_the_regimes_an_earlier_run_measured_with_their_provenance(tmp_path):
    f = tmp_path / "dispatch.json"
    assert dt.earlier_regimes(f, {}) == {}
    old = {"training": {"provenance": {"commit": "abc", "date": "d0"},
                        "regimes": {"sync": {"summary": {}},
                                    "one_step": {"summary": {}, "provenance": {"commit": "x"}}}}}
    f.write_text(json.dumps(old))
    kept = dt.earlier_regimes(f, {"one_step": {}})
    assert list(kept) == ["sync"] and kept["sync"]["provenance"]["commit"] == "abc"  # re-measured ones are replaced
    assert (set(dt.REGIMES) >= set(dt.RUN_OF_RECORD)
            and all(o[0].startswith("trainer.mode=") for o in dt.REGIMES.values()))
