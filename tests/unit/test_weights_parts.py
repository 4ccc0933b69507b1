"""bench/weights.py: a run of some --parts carries the others, and says so per part."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import weights  # noqa: E402
from bench.report_io import parts_line, parts_record  # noqa: E402

TP = {"100": {"raw_s": 0.1, "raw_gbps": 1.0, "cores": 2, "raw_cpu_s": 0.1,
              "network": {"push_s": 0.1, "pull_s": 0.1, "ratio": 0.55, "cpu_s": 0.2, "cpu_bound_ratio": 1.0},
              "same_host": {"push_s": 0.05, "pull_s": 0.05, "ratio": 1.1, "cpu_s": 0.1, "cpu_bound_ratio": 2.0}}}
STALL = {"10": {p: {"stall_s": 0.01, "full_transfer_s": 0.2, "fraction": 0.05, "first_stall_s": 0.02,
                    "spare_prepare_s": 0.1} for p in ("network", "same_host")}}
BC = {"model_mb": 200, "hop_rate": "200mbit", "chunk_bytes": 262144, "times": {"1": 8.0, "8": 8.4}}
XS = {"summary": "cross-site", "iteration_overhead": 0.01, "copies_per_version": 1.0}


@pytest.fixture
def fake_parts(monkeypatch):
    from bench import weights_broadcast, weights_xsite

    monkeypatch.setattr(weights, "bench_throughput", lambda *a, **k: TP)
    monkeypatch.setattr(weights, "bench_stall", lambda *a, **k: STALL)
    monkeypatch.setattr(weights_broadcast, "bench_broadcast", lambda *a, **k: BC)
    monkeypatch.setattr(weights_xsite, "bench_cross_site", lambda *a, **k: XS)


def test_full_run_measures_every_part(tmp_path, fake_parts):
    assert weights.main(["--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "weights.json").read_text())
    assert r["provenance"]["measured_in_this_run"] is True
    assert set(r["parts"]) == set("abcd") and all(p["measured_in_this_run"] for p in r["parts"].values())
    assert "every part was measured side by side in this run" in r["note"]
    md = (tmp_path / "weights.md").read_text()
    assert "Carried" not in md and md.count("Measured in this run") == 4 and "Provenance: commit" in md


def test_partial_run_carries_the_rest_with_their_run(tmp_path, fake_parts):
    weights.main(["--out", str(tmp_path)])
    first = json.loads((tmp_path / "weights.json").read_text())
    assert weights.main(["--out", str(tmp_path), "--parts", "c"]) == 0
    second = json.loads((tmp_path / "weights.json").read_text())
    assert second["provenance"]["measured_in_this_run"] is False
    assert second["parts"]["c"]["measured_in_this_run"] is True
    for part in "abd":
        assert second["parts"][part]["measured_in_this_run"] is False
        assert second["parts"][part]["carried_from"]["date"] == first["provenance"]["date"]
        assert second["parts"][part]["carried_from"]["commit"] == first["provenance"]["commit"]
    assert second["broadcast_ratio_8_vs_1"] == first["broadcast_ratio_8_vs_1"]
    assert "side by side in this run" not in second["note"] and "a, b, d carried" in second["note"]
    md = (tmp_path / "weights.md").read_text()
    assert md.count("**Carried** from an earlier run") == 3 and md.count("Measured in this run") == 1
    # carried twice: still points at the run that measured it, not at the run that carried it
    weights.main(["--out", str(tmp_path), "--parts", "a"])
    third = json.loads((tmp_path / "weights.json").read_text())
    assert third["parts"]["b"]["carried_from"]["date"] == first["provenance"]["date"]
    assert third["parts"]["c"]["carried_from"]["date"] == second["provenance"]["date"]


def test_quick_never_writes_the_results_of_record(monkeypatch, tmp_path, fake_parts):
    from bench import report_io

    monkeypatch.setattr(report_io, "QUICK_OUT", tmp_path / "quick")
    record = ROOT / "bench/results/weights.json"
    before = record.read_bytes()
    assert weights.main(["--quick", "--parts", "c"]) == 0
    assert (tmp_path / "quick" / "weights.json").is_file()
    assert record.read_bytes() == before


def test_parts_record_of_a_file_without_provenance():
    prov = {"commit": "0" * 40, "dirty": False, "date": "2026-01-01T00:00:00+00:00", "config_hash": "x"}
    parts = parts_record({"a": "throughput", "b": "broadcast"}, {"a": 1.0}, {"broadcast": {}}, prov)
    assert parts["b"] == {"key": "broadcast", "measured_in_this_run": False,
                          "carried_from": {"commit": None, "date": None,
                                           "note": "the earlier file recorded no provenance"}}
    assert prov["measured_in_this_run"] is False
    assert "Carried" in parts_line(parts, "b") and "no provenance" in parts_line(parts, "b")


def test_a_run_keeps_the_shaped_link_key_it_did_not_measure_and_shows_its_section(tmp_path, fake_parts):
    """``shaped_link`` is bench/weights_shaped.py's (its own provenance): kept as it was."""
    from tests.unit.test_weights_shaped_bench import _entry

    assert weights.main(["--out", str(tmp_path), "--parts", "c"]) == 0
    doc = json.loads((tmp_path / "weights.json").read_text())
    doc["shaped_link"] = _entry()
    (tmp_path / "weights.json").write_text(json.dumps(doc))
    assert weights.main(["--out", str(tmp_path), "--parts", "c"]) == 0
    assert json.loads((tmp_path / "weights.json").read_text())["shaped_link"] == _entry()
    assert "tbf-shaped link between two namespaces" in (tmp_path / "weights.md").read_text()
