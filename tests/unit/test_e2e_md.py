"""``bench/e2e_md.py``: e2e.md rendered again from e2e.json, carried blocks named by their own runs."""

from __future__ import annotations

from pathlib import Path

from bench.e2e_md import main, render, with_block_parts

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def test_carried_blocks_are_named_by_their_own_provenance_and_nothing_else_changes():
    result = {
        "provenance": {"commit": "abc", "parts": {
            "sync": "measured in this run",
            "trl_fair": "carried from bench/trl_fair.py (run of 2026-11-25T13:11:00+00:00)",
            "throughput_interleaved": "carried from bench/e2e_throughput.py (run of 2026-11-27T08:23:51+00:00)"}},
        "trl_fair": {"source": "bench/trl_fair.py", "provenance": {"date": "2026-11-28T10:39:01+00:00"}},
        "throughput_interleaved": {"source": "bench/e2e_throughput.py"},  # no provenance of its own: kept as it was
    }
    out = with_block_parts(result)
    assert out["provenance"]["parts"] == {
        "sync": "measured in this run",
        "trl_fair": "carried from bench/trl_fair.py (run of 2026-11-28T10:39:01+00:00)",
        "throughput_interleaved": "carried from bench/e2e_throughput.py (run of 2026-11-27T08:23:51+00:00)"}
    assert out["provenance"]["commit"] == "abc" and out["trl_fair"] is result["trl_fair"]
    assert result["provenance"]["parts"]["trl_fair"].endswith("(run of 2026-11-25T13:11:00+00:00)")  # input untouched


def test_the_committed_e2e_md_is_what_its_json_renders():
    """Fails when trl_fair.py or e2e_throughput.py set a block of e2e.json and e2e.md was not rendered again."""
    text = render(RESULTS)
    assert (RESULTS / "e2e.md").read_text() == text, "run python bench/e2e_md.py"


def test_check_and_write(tmp_path, capsys):
    (tmp_path / "e2e.json").write_text((RESULTS / "e2e.json").read_text())
    assert main(["--results", str(tmp_path), "--check"]) == 1  # no e2e.md yet
    assert main(["--results", str(tmp_path)]) == 0
    assert main(["--results", str(tmp_path), "--check"]) == 0
    assert (tmp_path / "e2e.md").read_text() == render(RESULTS)
    assert main(["--results", str(tmp_path / "missing")]) == 2
    assert "no e2e.json" in capsys.readouterr().err
