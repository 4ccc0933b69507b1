"""Following a run from a terminal: which config a deployment run uses, the per-iteration line,
``braid follow``'s formatting and exit status (pure parts; the walk through a real server is in
tests/integration/test_deployments.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from flows.follow_cli import LogLine, exit_code, format_line
from flows.rl_training import iteration_line, resolve_config
from services.common.config import load_config

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "deploy/configs/smoke.yaml")


def test_config_path_replaces_the_deployment_forms_config():
    """A deployment's form carries the default config; ``-p config_path=smoke.yaml`` must win."""
    form = load_config(ROOT / "deploy/configs/default.yaml")
    cfg = resolve_config(form, SMOKE, ["trainer.iterations=3"])
    assert cfg.trainer.prompts_per_iteration == load_config(SMOKE).trainer.prompts_per_iteration
    assert cfg.trainer.prompts_per_iteration != form.trainer.prompts_per_iteration
    assert cfg.trainer.iterations == 3


def test_config_alone_and_neither():
    smoke = load_config(SMOKE)
    assert resolve_config(smoke, None, []).model_dump() == smoke.model_dump()
    default = load_config(ROOT / "deploy/configs/default.yaml")
    assert resolve_config(None, None, []).model_dump() == default.model_dump()


def test_iteration_line_reads_as_a_sentence():
    row = {"iteration": 2, "reward_mean": 0.4567, "accuracy": 0.25, "loss": -0.01234, "response_len_mean": 12.34,
           "samples_per_s": 3.21, "staleness_mean": 0.5, "iteration_time_s": 4.56}
    assert iteration_line(row, 10) == ("iteration 3/10: reward 0.457, accuracy 0.250, loss -0.0123, mean length 12.3, "
                                       "3.2 samples/s, staleness 0.50, 4.6 s")


def test_follow_formats_levels_and_exit_status():
    t = datetime(2026, 11, 27, 12, 0, 5, tzinfo=UTC)
    local = t.astimezone().strftime("%H:%M:%S")
    assert format_line(LogLine(t, 20, "run directory: /x")) == f"{local}  run directory: /x"
    assert format_line(LogLine(t, 30, "w")) == f"{local}  WARNING w"
    assert format_line(LogLine(t, 40, "e")) == f"{local}  ERROR e"
    assert exit_code("COMPLETED") == 0
    assert [exit_code(s) for s in ("FAILED", "CRASHED", "CANCELLED")] == [1, 1, 1]


def test_follow_refuses_ambiguous_arguments(capsys):
    from flows.cli import main

    assert main(["follow"]) == 2
    assert "one of them" in capsys.readouterr().err
    assert main(["follow", "--deployment", "a/b", "--interval", "0"]) == 2
