"""bench/weights_shaped.py's pure half: a payload's row against the link's limit, its markdown,
(bench/weights.py keeps the key: tests/unit/test_weights_parts.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import weights_shaped  # noqa: E402


def _driver_out(transfer: list[float], nbytes: int = 50_000_000) -> dict:
    versions = [{"version": 1, "transfer_s": 9.0, "warmup": True}]
    versions += [{"version": i + 2, "transfer_s": t, "warmup": False} for i, t in enumerate(transfer)]
    return {"bytes": nbytes, "tensors": 3, "versions": versions, "link_bytes": int(nbytes * len(versions) * 1.05),
            "grpc_fallbacks": 0}


def test_a_row_compares_the_median_of_the_timed_versions_with_bytes_times_8_over_rate():
    row = weights_shaped.summarize("full", _driver_out([1.0, 1.25, 1.1]), rate_bps=400_000_000)
    assert row["limit_s"] == pytest.approx(1.0)  # 50 MB * 8 / 400 Mbit/s
    assert row["transfer_s"]["median"] == 1.1 and row["transfer_s"]["n"] == 3 and row["warmup_s"] == 9.0
    assert row["limit_vs_measured"] == pytest.approx(1 / 1.1)
    assert row["limit_vs_measured_range"] == pytest.approx([0.8, 1.0])
    assert row["link_bytes_per_version"] == pytest.approx(1.05) and row["meets_goal"] is True
    assert weights_shaped.summarize("full", _driver_out([1.3, 1.3, 1.3]), 400_000_000)["meets_goal"] is False


def _entry() -> dict:
    rows = {"full": weights_shaped.summarize("full", _driver_out([1.1, 1.2, 1.15]), 400_000_000)}
    return {"rate_bps": 400_000_000, "reps": 3, "payloads": rows, "summary": "shaped"}


def test_the_markdown_section_has_one_row_per_payload():
    md = "\n".join(weights_shaped.markdown(_entry()))
    assert "(400 Mbit/s)" in md and "| full | 50.0 | 1.150 [1.100-1.200], 3 | 1.000 | **0.870** | 1.050 |" in md
