"""``braid profile-train --quick`` on the smoke config's model: the real learner, timed."""

from __future__ import annotations

import json
from pathlib import Path

from allocator.train_profile import FORMAT, load_train_profile
from flows.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]


def test_profile_train_quick_writes_a_profile_whose_times_grow_with_tokens(tmp_path, capsys):
    out = tmp_path / "smoke-train.json"
    rc = cli_main(["profile-train", "--config", str(ROOT / "deploy/configs/smoke.yaml"), "--quick", "--threads", "1",
                   "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out  # a progress line per grid point, then the summary
    assert printed.count("ms/step") == 4
    summary = json.loads(printed[printed.index("\n{") + 1:])
    raw = json.loads(out.read_text())
    assert raw["format"] == FORMAT and raw["hardware"] == "cpu-local" and raw["algorithm"] == "grpo"
    assert raw["device"] == "cpu" and raw["threads"] == 1 and raw["reference_model"] is False
    assert raw["model"]["fingerprint"]["hidden"] == 64 and raw["model"]["fingerprint"]["layers"] == 1
    prof = load_train_profile(out)
    assert len(prof.points) == 4 and prof.effective_flops > 0 and prof.fixed_s >= 0
    by_tokens = sorted(prof.points, key=lambda p: p.tokens)
    assert by_tokens[-1].tokens >= 10 * by_tokens[0].tokens and by_tokens[-1].seconds > by_tokens[0].seconds
    assert summary["out"] == str(out) and summary["points"] == 4
