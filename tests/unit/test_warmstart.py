"""The warm start's SFT pass on the built tiny model: its progress bar counts the steps it shows a loss for."""

from __future__ import annotations

import re
from pathlib import Path

from services.common.config import load_config
from services.policy.warmstart import base_policy, sft

ROOT = Path(__file__).resolve().parents[2]


def test_the_progress_bar_counts_the_steps_beside_the_loss(capsys):
    steps = 12
    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", [f"warmstart.steps={steps}", "warmstart.batch_size=4"])
    losses = sft(base_policy(cfg), cfg).losses
    frames = [f for f in re.split(r"[\r\n]", capsys.readouterr().err) if "warm start (SFT)" in f]
    counted = [(int(m.group(1)), m.group(2)) for f in frames
               if (m := re.search(rf"(\d+)/{steps} .*loss=([-\d.]+)", f))]
    assert counted, frames
    assert all(done >= 1 for done, _ in counted), frames  # a loss is shown only once a step has been counted
    assert counted[-1] == (steps, f"{losses[-1]:.3f}") and len(losses) == steps


def test_checks_come_every_check_every_steps_and_four_times_as_far_while_far_from_the_target():
    from services.policy.warmcheck import Check
    from services.policy.warmstart import next_check

    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", ["warmstart.target_accuracy=0.4",
                                                            "warmstart.check_every=10"])
    ws = cfg.warmstart
    assert next_check([], ws) == 10
    far, near = Check(10, 0.19, 64, False, 0.1), Check(50, 0.2, 64, False, 0.1)
    assert next_check([far], ws) == 50  # below half the target: 4 x 10 steps on
    assert next_check([far, near], ws) == 60  # half the target reached: every 10 steps


def test_a_target_needs_single_turn_sft():
    import pytest

    from services.common.config import ConfigError

    with pytest.raises(ConfigError, match=r"warmstart\.target_accuracy"):
        load_config(ROOT / "deploy/configs/smoke.yaml", ["warmstart.target_accuracy=0.3", "warmstart.steps=0"])
    with pytest.raises(ConfigError, match="agentic warm starts"):
        load_config(ROOT / "deploy/configs/agentic.yaml", ["warmstart.target_accuracy=0.3"])
