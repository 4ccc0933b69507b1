"""Prefect flow ``rl_training``: one asynchronous RL run, end to end.

The flow only wires steps and passes paths: resolve the config into a run directory, make sure
the warm-start checkpoint exists (a cached SFT pass), start the Stream Generation Service and
the trainer as separate processes on loopback, watch them (a dead process fails the flow with
its log tail), mirror progress into a Prefect progress artifact and a terminal bar, then write
the report and publish it as artifacts: the markdown report with its plots inlined, and a table
of per-iteration metrics. The result is the run summary, whose ``final_checkpoint`` is the trained
model the trainer wrote to ``<run_dir>/final`` (``services/run/final.py``).

Parameters are typed (pydantic models from ``services/common/config.py``), so a deployment's
Run form in the Prefect UI shows every field with its default, help text and bounds, and the
server refuses out-of-range values before a run is created. With ``sites`` set, the services run
as per-site flow runs on the sites' work pools instead (``flows/two_site.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from tqdm import tqdm

from flows.artifacts import embed_images, metrics_table, read_metrics
from flows.launcher import run_processes
from flows.online_ranker import OnlineRetrainer
from flows.processes import child_env
from flows.registries import check_run, is_emulated
from flows.report import write_report
from flows.tracking import tracked
from flows.two_site import TwoSiteConfig, run_two_sites
from services.common.config import ConfigError, RunConfig, apply_overrides, load_config, write_config
from services.common.progress import progress_interval
from services.run.forgetting import flag_line


def new_run_dir(cfg: RunConfig) -> Path:
    run_id = cfg.run_id or time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(cfg.runs_dir) / run_id
    if (run_dir / "summary.json").exists():
        raise FileExistsError(f"{run_dir} already holds a finished run; choose another run_id")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


DEFAULT_CONFIG = "deploy/configs/default.yaml"


def resolve_config(config: RunConfig | None, config_path: str | None, overrides: list[str]) -> RunConfig:
    """The run's config with ``overrides`` applied: the file ``config_path`` when one is named (it
    replaces ``config``: a deployment's form carries the default config, and ``-p config_path=...``
    must not be silently ignored), else ``config``, else ``DEFAULT_CONFIG``."""
    if config_path is not None or config is None:
        return load_config(config_path or DEFAULT_CONFIG, overrides)
    try:
        return RunConfig.model_validate(apply_overrides(config.model_dump(mode="json"), overrides))
    except ValueError as err:  # pydantic's ValidationError names the field and the rule
        raise ConfigError(f"invalid config (flow parameter 'config' with overrides {overrides}): {err}") from None


@task(name="prepare-run")
def prepare_run(config: RunConfig | None, config_path: str | None, overrides: list[str]) -> str:
    if config is not None and config_path is not None:
        get_run_logger().warning("config_path %s given: it replaces the 'config' parameter", config_path)
    cfg = check_run(resolve_config(config, config_path, overrides))
    run_dir = new_run_dir(cfg)
    write_config(cfg, run_dir / "config.json")
    (run_dir / "metrics.jsonl").write_text("")
    return str(run_dir)


@task(name="warm-start", retries=0)
def warm_start(run_dir: str) -> str:
    """The cached SFT warm start, or one trained in a child process (its progress bar goes to the
    terminal); a cached one is found here without starting that process (it imports torch)."""
    out = Path(run_dir) / "warmstart.path"
    from services.policy.warmcache import cached_warmstart

    cached = cached_warmstart(load_config(Path(run_dir) / "config.json"))
    if cached is not None:
        out.write_text(str(cached.resolve()) + "\n")
        return str(cached.resolve())
    cmd = [sys.executable, "-m", "services.policy.warmstart", "--config", str(Path(run_dir) / "config.json"),
           "--out", str(out)]
    proc = subprocess.run(cmd, env=child_env(2), stderr=None, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"warm start failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
    return out.read_text().strip()


def iteration_line(row: dict, iterations: int) -> str:
    """One metrics row as the line a person follows a run by (the flow run's log, ``braid follow``).
    An EMULATED row says so and gives its modelled rate and time (wall / ``emulated_time_scale``)."""
    line = (f"iteration {row['iteration'] + 1}/{iterations}: reward {row['reward_mean']:.3f}, accuracy "
            f"{row['accuracy']:.3f}, loss {row['loss']:.4f}, mean length {row['response_len_mean']:.1f}, "
            f"{row['samples_per_s']:.1f} samples/s, staleness {row['staleness_mean']:.2f}, "
            f"{row['iteration_time_s']:.1f} s")
    scale = row.get("emulated_time_scale")
    if scale is None:
        return line
    return (f"EMULATED {line} of wall time; modelled {row['samples_per_s'] * scale:.2f} samples/s, "
            f"{row['iteration_time_s'] / scale:.1f} s")


def suites_line(row: dict) -> str | None:
    """The suites a metrics row scored between steps, as one log line (None: it scored none)."""
    acc = row.get("suite_accuracy")
    if not acc:
        return None
    scores = ", ".join(f"{name} {a:.3f} ± {row['suite_stderr'][name]:.3f}" for name, a in acc.items())
    return f"suites at weight version {row['weight_version']}: {scores} ({row['suite_eval_s']:.1f} s)"


def forgetting_warnings(logger, flags: list[dict], stopped: dict | None = None) -> None:
    """Each forgetting flag (``services.run.forgetting``) as a warning in the flow's log, and an early stop."""
    for flag in flags:
        logger.warning(flag_line(flag))
    if stopped:
        logger.warning("the run stopped after the step to weight version %d (%s: %s)", stopped["weight_version"],
                       stopped["reason"], ", ".join(stopped["suites"]))


class _Progress:
    """Mirrors metrics.jsonl into a Prefect progress artifact, a terminal bar and one log line per
    iteration (made in a flow or task run: its logger is that run's)."""

    def __init__(self, run_dir: Path, iterations: int) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.iterations = iterations
        self.seen = 0
        self.logger = get_run_logger()
        self.artifact_id = create_progress_artifact(0.0, key="rl-training-progress",
                                                    description="RL iterations completed")
        self.bar = tqdm(total=iterations, desc="RL iterations", unit="it", mininterval=progress_interval())

    def __call__(self) -> None:
        rows = read_metrics(self.path)
        if len(rows) > self.seen:
            for row in rows[self.seen:]:
                self.logger.info(iteration_line(row, self.iterations))
                if (line := suites_line(row)) is not None:
                    self.logger.info(line)
                forgetting_warnings(self.logger, row.get("forgetting", []))
            self.bar.update(len(rows) - self.seen)
            self.seen = len(rows)
            last = rows[-1]
            self.bar.set_postfix(reward=f"{last['reward_mean']:.2f}", stale=f"{last['staleness_mean']:.1f}")
            update_progress_artifact(self.artifact_id, 100.0 * self.seen / self.iterations)

    def close(self) -> None:
        self()
        self.bar.close()


@task(name="run-services")
def run_services(run_dir: str, checkpoint: str) -> str:
    """Start the SGS and the trainer as processes, supervise them, return summary.json's path."""
    rd = Path(run_dir)
    cfg = load_config(rd / "config.json")
    progress = _Progress(rd, cfg.trainer.iterations)
    retrainer = OnlineRetrainer(rd, cfg, checkpoint)  # generation.retrain.every: the ranker learns from this run

    def poll() -> None:
        progress()
        retrainer(progress.seen)

    try:
        summary = run_processes(rd, checkpoint, on_poll=poll)
        # once more with the final count: a run whose last iterations finished between two polls (a
        # 2-iteration run on a fast machine: the poll saw 0, then the trainer was gone) still starts
        # the retrain that came due, and close() waits for its row
        poll()
    finally:
        progress.close()
        retrainer.close()
    return str(summary)


def run_sites(run_dir: str, checkpoint: str, sites: TwoSiteConfig) -> str:
    """Two-site mode: the site flow runs (on their pools' workers) run the services; this flow
    run starts and watches them (flows/two_site.py). Not a task: it creates subflow runs."""
    rd = Path(run_dir)
    progress = _Progress(rd, load_config(rd / "config.json").trainer.iterations)
    try:
        summary = run_two_sites(rd, checkpoint, sites, on_poll=progress)
    finally:
        progress.close()
    return str(summary)


def load_plan(plan: dict | str) -> dict:
    """An allocation plan (``plan_allocation`` / ``braid allocate --json``): the dict, or its JSON file."""
    if isinstance(plan, dict):
        data = plan
    else:
        try:
            data = json.loads(Path(plan).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:  # unreadable, not UTF-8, not JSON
            raise ConfigError(f"allocation plan {plan}: cannot read it as JSON: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"allocation plan {plan if isinstance(plan, str) else '(dict)'}: expected a JSON object, "
                          f"got {type(data).__name__}")
    missing = [k for k in ("model", "gen_gpus", "train_gpus", "gen_instances") if k not in data]
    if missing:
        raise ConfigError(f"allocation plan {'(dict)' if isinstance(plan, dict) else plan}: missing fields {missing}")
    return data


def plan_overrides(plan: dict, cfg: RunConfig) -> list[str]:
    """An EMULATED run becomes the fleet the plan describes (``flows.emulated_plan``); a real run on
    the local CPU cluster (braid-tiny) takes its number of SGS instances; a real plan for GPUs only
    goes into the run report (this flow runs the local services)."""
    if is_emulated(cfg):
        from flows.emulated_plan import emulated_overrides

        return emulated_overrides(plan, cfg.generation.page_size, cfg.weights.delta)
    return [f"generation.instances={plan['gen_instances']}"] if plan["model"] == "braid-tiny" else []


def _plan_section(rd: Path) -> str:
    path = rd / "allocation_plan.json"
    if not path.exists():
        return ""
    plan = json.loads(path.read_text())
    return (f"\n\n## Allocation plan\n\n{plan['model']} on {plan['cluster']} ({plan['workload']}): "
            f"{plan['gen_gpus']} x {plan['gen_kind']} generation ({plan['gen_parallel']}, {plan['t_gen_s']:.1f} s), "
            f"{plan['train_gpus']} x {plan['train_kind']} training ({plan['train_parallel']}, "
            f"{plan['t_train_s']:.1f} s); "
            f"predicted iteration {plan['iteration_s']:.1f} s, {plan['samples_per_s']:.2f} samples/s.\n")


@task(name="report")
def report(run_dir: str) -> str:
    rd = Path(run_dir)
    path = write_report(rd)
    emulated = " (EMULATED: times of an emulation, modelled = wall / time scale)" if is_emulated(
        load_config(rd / "config.json")) else ""
    create_markdown_artifact(
        embed_images(path.read_text(), rd) + _plan_section(rd), key="rl-training-report",
        description=f"Braid run {rd.name}{emulated}",
    )
    create_table_artifact(
        metrics_table(read_metrics(rd / "metrics.jsonl")), key="rl-training-metrics",
        description=f"Per-iteration metrics of Braid run {rd.name}{emulated}",
    )
    return str(path)


@flow(name="rl_training", log_prints=True)
def rl_training(
    config: RunConfig | None = None,
    sites: TwoSiteConfig | None = None,
    config_path: str | None = None,
    overrides: list[str] | None = None,
    plan: dict | str | None = None,
) -> dict:
    """Run asynchronous GRPO end to end; returns the run summary.

    Args:
        config: The run config; every field has its default, bounds and help. Used when config_path is empty.
        sites: Two-site mode: run the services as per-site flow runs on the sites' work pools. Empty: run them
            as local processes of this flow run (what `braid run` does).
        config_path: YAML run config file (the CLI's --config); when set it replaces config. Both empty:
            deploy/configs/default.yaml.
        overrides: key.sub=value overrides applied on top of the config (the CLI's --set).
        plan: An allocation plan (plan_allocation's result, or its JSON file). An EMULATED run (engine, learner and
            reward 'emulated') runs the planned fleet; a real braid-tiny run takes its number of SGS instances;
            otherwise it is recorded in the run report.
    """
    logger = get_run_logger()
    allocation = load_plan(plan) if plan is not None else None
    overrides = list(overrides or [])
    extra = (plan_overrides(allocation, resolve_config(config, config_path, overrides))
             if allocation is not None else [])
    run_dir = prepare_run(config, config_path, extra + overrides)  # the caller's overrides have the last word
    if allocation is not None:
        (Path(run_dir) / "allocation_plan.json").write_text(json.dumps(allocation, indent=2) + "\n")
    logger.info("run directory: %s", Path(run_dir).resolve())
    with tracked(Path(run_dir), load_config(Path(run_dir) / "config.json").tracking, logger):
        checkpoint = warm_start(run_dir)
        summary_path = run_services(run_dir, checkpoint) if sites is None else run_sites(run_dir, checkpoint, sites)
        report_path = report(run_dir)
    summary = json.loads(Path(summary_path).read_text())
    logger.info("report: %s", Path(report_path).resolve())
    if "emulated" in summary:
        emu = summary["emulated"]
        logger.info("EMULATED run (time scale %g): modelled %.2f samples/s, %.1f s of modelled RL time; tokens are "
                    "synthetic and the accuracy is the declared reward rate (emulation measures time, never learning)",
                    emu["time_scale"], emu["modelled_samples_per_second"], emu["modelled_rl_seconds"])
        cp = summary.get("control_plane") or {}
        if cp.get("flagged"):
            logger.warning("FLAGGED: the control plane may have set this EMULATED run's pace (%s); its modelled "
                           "figures are a lower bound on the fleet's", "; ".join(cp["why"]))
    logger.info(
        "warm start %.3f -> final %.3f (stderr %.3f) on %d held-out prompts; %.1f samples/s (%s)",
        summary["warmstart_accuracy"], summary["final_accuracy"], summary["accuracy_stderr"],
        summary["eval_prompts"], summary["samples_per_second"], summary["mode"],
    )
    for name, suite in list((summary.get("suites") or {}).items())[1:]:  # the held-out split's line is above
        logger.info("suite %s: warm start %.3f -> final %.3f (stderr %.3f) on %d prompts", name,
                    suite["before"]["accuracy"], suite["after"]["accuracy"], suite["after"]["stderr"],
                    suite["after"]["prompts"])
    forgetting_warnings(logger, summary.get("forgetting", []), summary.get("stopped_early"))
    logger.info("final model: %s", summary["final_checkpoint"])  # services/run/final.py
    return {"run_dir": run_dir, **summary}
