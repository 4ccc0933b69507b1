"""Prefect flow ``rl_training``: one asynchronous RL run, end to end.

The flow only wires steps and passes paths: resolve the config into a run directory, make sure
the warm-start checkpoint exists (a cached SFT pass), start the Stream Generation Service and
the trainer as separate processes on loopback, watch them (a dead process fails the flow with
its log tail), mirror progress into a Prefect progress artifact and a terminal bar, then write
the report and publish it as a markdown artifact.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from tqdm import tqdm

from flows.launcher import Supervisor, child_env
from flows.report import write_report
from services.common.progress import progress_interval
from services.common.config import RunConfig, load_config, write_config

SGS_READY_TIMEOUT_S = 180


def new_run_dir(cfg: RunConfig) -> Path:
    run_id = cfg.run_id or time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(cfg.runs_dir) / run_id
    if (run_dir / "summary.json").exists():
        raise FileExistsError(f"{run_dir} already holds a finished run; choose another run_id")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


@task(name="prepare-run")
def prepare_run(config_path: str | None, overrides: list[str]) -> str:
    cfg = load_config(config_path, overrides)
    run_dir = new_run_dir(cfg)
    write_config(cfg, run_dir / "config.json")
    (run_dir / "metrics.jsonl").write_text("")
    return str(run_dir)


@task(name="warm-start", retries=0)
def warm_start(run_dir: str) -> str:
    """Run the cached SFT warm start in a child process (its progress bar goes to the terminal)."""
    out = Path(run_dir) / "warmstart.path"
    cmd = [sys.executable, "-m", "services.policy.warmstart", "--config", str(Path(run_dir) / "config.json"), "--out", str(out)]
    proc = subprocess.run(cmd, env=child_env(2), stderr=None, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"warm start failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
    return out.read_text().strip()


def _read_metrics(path: Path) -> list[dict]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def _watch(sup: Supervisor, trainer, run_dir: Path, iterations: int) -> None:
    """Poll the services until the trainer exits; mirror progress to Prefect and the terminal."""
    artifact_id = create_progress_artifact(0.0, key="rl-training-progress", description="RL iterations completed")
    seen = 0
    with tqdm(total=iterations, desc="RL iterations", unit="it", mininterval=progress_interval()) as bar:
        while trainer.proc.poll() is None:
            sup.check()
            rows = _read_metrics(run_dir / "metrics.jsonl")
            if len(rows) > seen:
                bar.update(len(rows) - seen)
                seen = len(rows)
                last = rows[-1]
                bar.set_postfix(reward=f"{last['reward_mean']:.2f}", stale=f"{last['staleness_mean']:.1f}")
                update_progress_artifact(artifact_id, 100.0 * seen / iterations)
            time.sleep(0.5)
        bar.update(len(_read_metrics(run_dir / "metrics.jsonl")) - seen)
    sup.check()  # a non-zero trainer exit raises with its log tail
    update_progress_artifact(artifact_id, 100.0)


@task(name="run-services")
def run_services(run_dir: str, checkpoint: str) -> str:
    """Start the SGS and the trainer as processes, supervise them, return summary.json's path."""
    rd = Path(run_dir)
    cfg = load_config(rd / "config.json")
    sup = Supervisor(rd)
    try:
        port_file = rd / "sgs.port"
        port_file.unlink(missing_ok=True)
        sup.start(
            "sgs", "services.generation",
            ["--config", str(rd / "config.json"), "--model", checkpoint, "--port", "0", "--port-file", str(port_file)],
            threads=cfg.generation.threads,
        )
        port = sup.wait_for_file(port_file, SGS_READY_TIMEOUT_S)
        trainer = sup.start(
            "trainer", "services.trainer",
            ["--config", str(rd / "config.json"), "--model", checkpoint, "--sgs", f"127.0.0.1:{port}", "--run-dir", run_dir],
            threads=cfg.trainer.threads, expect_exit=True,
        )
        _watch(sup, trainer, rd, cfg.trainer.iterations)
    finally:
        sup.stop_all()
    return str(rd / "summary.json")


@task(name="report")
def report(run_dir: str) -> str:
    path = write_report(Path(run_dir))
    create_markdown_artifact(path.read_text(), key="rl-training-report", description=f"Braid run {Path(run_dir).name}")
    return str(path)


@flow(name="rl_training", log_prints=True)
def rl_training(config_path: str | None = "deploy/configs/default.yaml", overrides: list[str] | None = None) -> dict:
    """Run asynchronous GRPO end to end; returns the run summary."""
    logger = get_run_logger()
    run_dir = prepare_run(config_path, list(overrides or []))
    logger.info("run directory: %s", run_dir)
    checkpoint = warm_start(run_dir)
    summary_path = run_services(run_dir, checkpoint)
    report(run_dir)
    summary = json.loads(Path(summary_path).read_text())
    logger.info(
        "warm start %.3f -> final %.3f (stderr %.3f) on %d held-out prompts; %.1f samples/s (%s)",
        summary["warmstart_accuracy"], summary["final_accuracy"], summary["accuracy_stderr"],
        summary["eval_prompts"], summary["samples_per_second"], summary["mode"],
    )
    return {"run_dir": run_dir, **summary}
