"""bench/dispatch.py's inputs and headline computation (the benchmark itself is run by hand)."""

from __future__ import annotations

import json

import pytest

from bench.dispatch import targets
from bench.dispatch_data import EstimatesError, build_workload, load_estimates


def _write(path, rows):
    path.write_text("\n".join(json.dumps(r) if isinstance(r, dict) else r for r in rows) + "\n")
    return path


@pytest.mark.parametrize(
    "bad, match",
    [
        ('{"prompt": "a", "response_length": 3', "line 2: not JSON"),
        ({"prompt": "a", "response_length": 0, "estimated_length": 1.0},
         "line 2: field 'response_length' must be a positive number"),
        ({"prompt": "a", "response_length": 5}, "line 2: field 'estimated_length' must be a positive number, got None"),
        ({"prompt": 7, "response_length": 5, "estimated_length": 1.0}, "line 2: field 'prompt' must be a string"),
    ],
)
def test_bad_estimates_files_name_file_line_and_field(tmp_path, bad, match):
    good = {"prompt": "q", "response_length": 10, "estimated_length": 2.5}
    path = _write(tmp_path / "est.jsonl", [good, bad])
    with pytest.raises(EstimatesError, match=f"est.jsonl: {match}"):
        load_estimates(path)
    with pytest.raises(EstimatesError, match="no such estimates file"):
        load_estimates(tmp_path / "missing.jsonl")


def test_workloads_and_headline(tmp_path):
    rows = [{"prompt": "x" * (40 + i), "response_length": 4 * (1 + i % 97), "estimated_length": float(1 + i % 89)}
            for i in range(700)]
    loaded = load_estimates(_write(tmp_path / "est.jsonl", rows))
    multi = build_workload(loaded, "long", "multi", chars_per_token=4.0, seed=0)
    assert len(multi.lengths) == 512 * 8 and max(multi.lengths) <= 20_000 and len(multi.history) == 700 - 512
    assert multi.groups[0] == multi.groups[7] != multi.groups[8]
    one = build_workload(loaded, "short", "one", chars_per_token=4.0, seed=0)
    assert len(set(one.groups)) == len(one.lengths) == 700 - 700 // 8
    m = {"random+fcfs": 120.0, "round_robin+fcfs": 110.0, "least_loaded+fcfs": 115.0, "lpt+fcfs": 105.0,
         "lpt+fcfs/oracle": 100.0, "random+lpt": 119.0, "random+lpt/oracle": 118.0, "random@prompt+fcfs": 126.0}
    t = targets({"h20/long-multi": m})
    assert t["best_ranker_policy"] == "lpt+fcfs" and t["speedup_vs_random"] == pytest.approx(120 / 105)
    assert t["speedup_vs_best_baseline"] == pytest.approx(110 / 105) and t["ranker_vs_oracle"] == pytest.approx(1.05)
    assert all(t["targets"].values())
