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
    emulated = iteration_line({**row, "emulated_time_scale": 0.02}, 10)
    assert emulated.startswith("EMULATED iteration 3/10")
    assert emulated.endswith("4.6 s of wall time; modelled 0.06 samples/s, 228.0 s")


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
    assert "--interval" in capsys.readouterr().err


def test_follow_without_a_server_says_what_to_export(tmp_path):
    """Without PREFECT_API_URL the client would start a throwaway local server that has no runs."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | {"PREFECT_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "flows.cli", "follow", "--deployment", "a/b"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "export PREFECT_API_URL" in out.stderr, out.stderr


def test_log_cursor_prints_each_line_once_even_when_lines_arrive_late():
    from datetime import timedelta
    from types import SimpleNamespace

    from flows.follow_cli import LogCursor

    t = datetime(2026, 11, 27, 12, 0, 0, tzinfo=UTC)

    def rec(i: int, dt: float):
        return SimpleNamespace(id=i, timestamp=t + timedelta(seconds=dt), level=20, message=f"m{i}", task_run_id=None)

    cursor = LogCursor()
    assert cursor.since() is None
    assert [x.message for x in cursor.take([rec(1, 0), rec(3, 2)])] == ["m1", "m3"]
    assert cursor.since() == t + timedelta(seconds=2 - LogCursor.LATE_S)
    # the next read overlaps the last one and brings a line stamped before m3 that reached the server late
    assert [x.message for x in cursor.take([rec(1, 0), rec(2, 1), rec(3, 2), rec(4, 3)])] == ["m2", "m4"]
    assert cursor.take([rec(4, 3)]) == []


def test_completed_tasks_last_lines_are_left_out_failures_are_not():
    from types import SimpleNamespace

    from flows.follow_cli import LogCursor

    t = datetime(2026, 11, 27, 12, 0, 0, tzinfo=UTC)
    recs = [SimpleNamespace(id=1, timestamp=t, level=20, message="Finished in state Completed()", task_run_id="t1"),
            SimpleNamespace(id=2, timestamp=t, level=40, message="Finished in state Failed('x')", task_run_id="t2"),
            SimpleNamespace(id=3, timestamp=t, level=20, message="Finished in state Completed()", task_run_id=None)]
    assert [x.message for x in LogCursor().take(recs)] == ["Finished in state Failed('x')",
                                                           "Finished in state Completed()"]
