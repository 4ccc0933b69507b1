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
    losses = sft(base_policy(cfg), cfg)
    frames = [f for f in re.split(r"[\r\n]", capsys.readouterr().err) if "warm start (SFT)" in f]
    counted = [(int(m.group(1)), m.group(2)) for f in frames
               if (m := re.search(rf"(\d+)/{steps} .*loss=([-\d.]+)", f))]
    assert counted, frames
    assert all(done >= 1 for done, _ in counted), frames  # a loss is shown only once a step has been counted
    assert counted[-1] == (steps, f"{losses[-1]:.3f}") and len(losses) == steps
