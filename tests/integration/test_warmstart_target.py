"""The warm start to an accuracy target (``warmstart.target_accuracy``), with the run's engine in the
warm-start process: it stops at the first check that reaches the target, and says so when none does."""

from __future__ import annotations

import json
from itertools import pairwise

from services.common.config import load_config
from tests.conftest import FAST_ENGINE, ROOT


def _warmstart(tmp_path, *overrides: str) -> dict:
    from services.policy.warmstart import ensure_warmstart

    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", [FAST_ENGINE, f"cache_dir={tmp_path}", "warmstart.steps=120",
                                                            "warmstart.check_every=10", "warmstart.check_prompts=64",
                                                            *overrides])
    out = ensure_warmstart(cfg, progress=False)
    return json.loads((out / "warmstart.json").read_text())


def test_the_sft_stops_at_the_first_check_that_reaches_the_target(tmp_path):
    meta = _warmstart(tmp_path, "warmstart.target_accuracy=0.05")
    checks = meta["checks"]
    assert meta["target_reached"] is True and checks[-1]["accuracy"] >= 0.05
    assert all(c["accuracy"] < 0.05 for c in checks[:-1])  # no earlier check reached it
    assert meta["steps"] == checks[-1]["step"] < meta["max_steps"] == 120
    # checks every 10 steps, 40 while below half the target
    assert checks[0]["step"] == 10 and all(b["step"] - a["step"] == (40 if a["accuracy"] < 0.025 else 10)
                                           for a, b in pairwise(checks))


def test_an_unreached_target_trains_every_step_and_says_so(tmp_path, capsys):
    meta = _warmstart(tmp_path, "warmstart.target_accuracy=1.0", "warmstart.steps=30")
    assert meta["target_reached"] is False and meta["steps"] == 30 and meta["checks"][-1]["step"] == 30
    assert "short of warmstart.target_accuracy 1.0" in capsys.readouterr().err


def test_a_check_is_a_function_of_the_weights(tmp_path):
    """Every check prompt is sampled with a seed of its own: the same weights score the same,
    whatever the engine sampled before."""
    from services.policy.warmcheck import AccuracyCheck
    from services.policy.warmstart import base_policy, sft

    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", [FAST_ENGINE, "warmstart.target_accuracy=1.0",
                                                            "warmstart.check_prompts=64", "warmstart.steps=40"])
    policy = base_policy(cfg)
    sft(policy, cfg.model_copy(update={"warmstart": cfg.warmstart.model_copy(update={"target_accuracy": None})}),
        progress=False)
    with AccuracyCheck(cfg, policy) as check:
        first, second = check(policy, 40), check(policy, 40)
    assert first.accuracy == second.accuracy and first.prompts == 64
