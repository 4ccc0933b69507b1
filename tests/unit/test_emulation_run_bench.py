"""bench/emulation_run.py's pure parts: a run's steady figures, the paired errors, the emulation's overrides."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.emulation_run import CONFIG, METRICS, base_overrides, compare, emulation_overrides, markdown, steady


def _rows(it: float, gen: float, train: float, n: int = 4) -> list[dict]:
    first = {"iteration_time_s": 99.0, "gen_time_s": 99.0, "train_time_s": 99.0, "samples": 1, "trained_samples": 1}
    return [first] + [{"iteration_time_s": it, "gen_time_s": gen, "train_time_s": train, "samples": 256,
                       "trained_samples": 192}] * n


def test_steady_leaves_the_first_iteration_out_and_counts_samples_over_the_iterations_time():
    got = steady(_rows(2.0, 1.5, 0.5))
    assert got["iteration_time_s"] == 2.0 and got["train_time_s"] == 0.5 and got["iterations"] == 4
    assert got["samples_per_s"] == pytest.approx(128.0) and got["trained_fraction"] == 0.75
    with pytest.raises(ValueError, match="at least 2"):
        steady(_rows(1, 1, 1, n=0))


def test_compare_pairs_each_round_and_the_table_keeps_measured_and_emulated_apart():
    rounds = [{"real": {"steady": steady(_rows(2.0, 1.5, 0.5)), "cores_busy": 1.8},
               "emulated": {"steady": steady(_rows(1.0 + k / 10, 0.75, 0.25))}} for k in range(3)]
    got = compare(rounds)
    assert list(got) == list(METRICS)
    assert got["iteration_time_s"]["error"]["per_round"] == pytest.approx([-0.5, -0.45, -0.4])
    assert got["iteration_time_s"]["error"]["median"] == pytest.approx(-0.45)
    res = {"provenance": {"commit": "0" * 40, "dirty": False, "config_hash": "h", "date": "d", "command": "c",
                          "versions": {}, "machine": {"cpu": "cpu", "cores": 2, "mem_gb": 8.0}},
           "rounds": 3, "instances": 2, "iterations": 5, "cores": 2, "compare": got, "rounds_detail": rounds}
    text = markdown(res)
    assert "EMULATED" in text and "-45.0%" in text and "1.80 of 2 cores" in text


def test_the_emulation_overrides_make_a_valid_emulated_run_of_the_same_config(tmp_path):
    from flows.registries import check_emulated, is_emulated
    from services.common.config import load_config

    ns = SimpleNamespace(instances=2, iterations=5)
    cfg = load_config(CONFIG, [*base_overrides(ns), *emulation_overrides("p.json", "t.json", "g.sqlite", 0.25)])
    check_emulated(cfg)
    assert is_emulated(cfg) and cfg.reward.rate == 0.25 and cfg.generation.instances == 2
    assert cfg.trainer.emulation.train_profile == "t.json" and cfg.generation.emulation.lengths == "g.sqlite"
