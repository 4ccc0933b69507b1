"""Config of the output-length ranker's online adaptation inside a run (pure data)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.common.strict import StrictModel


class RetrainConfig(StrictModel):
    """Online adaptation of the output-length ranker inside a run (StreamRL §5.2; ``flows/online_ranker.py``)."""

    every: int = Field(
        0, ge=0, le=1_000_000,
        description="Retrain the ranker on the run's own generation log every N iterations and hot-swap it "
        "(0 = never); needs generation.genlog and generation.ranker_dir.",
    )
    kind: str = Field(
        "lightgbm", max_length=64, description="Ranker kind (ranker.base.kinds(); checked when the run is prepared)."
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword parameters of the kind (causal_lm: base_path defaults to the run's policy checkpoint).",
    )
    n_recent: int = Field(20_000, ge=20, le=10_000_000, description="Train on the N most recent finished samples.")
    min_samples: int = Field(
        200, ge=10, le=10_000_000, description="Fewest logged samples a retrain needs (else it waits)."
    )
    holdout_fraction: float = Field(
        0.1, gt=0.0, le=0.5, description="Newest fraction of the samples held out to compare the old and new ranker."
    )


def ranker_dir_problem(run: Any) -> str | None:
    """Why ``generation.ranker_dir`` would change nothing in ``run`` (a ``RunConfig``), or None.

    Its readers: the SGS router (estimates prompts without one); and, in a single-turn run, the
    orchestrator, with any number of instances (one included): each group's estimate orders a
    batch's launches and rides with its prompt for the instance's LPT admission (admission lpt),
    and places groups over several instances (more than one, or scale-out). An agentic run without
    the router, or one fixed instance admitting FCFS, reads it nowhere; a store that
    ``generation.retrain`` publishes to is still a store worth keeping."""
    gen = run.generation
    if gen.ranker_dir is None or gen.retrain.every or run.uses_router:
        return None
    if run.agentic.enabled:
        return ("generation.ranker_dir is read by the SGS router only in an agentic run (its turns are not placed by "
                "length estimates): set generation.dispatch.router 'on', or drop ranker_dir")
    if gen.instances == 1 and not run.scaleout.enabled and gen.admission == "fcfs":
        return ("generation.ranker_dir changes nothing with one instance admitting FCFS (no placement to make, no "
                "LPT order): set generation.admission 'lpt' (the default), or drop ranker_dir")
    return None


class RunSignalsConfig(StrictModel):
    """Length estimates from the run itself (``services.generation.scheduling.run_signals``): each prompt's
    earlier visits and its group's finished siblings, on top of the text ranker's estimate (issue 55)."""

    enabled: bool = Field(
        False,
        description="Estimate each new group from its prompt's lengths in earlier visits of this run (weighted to the "
        "recent) with the ranker's (or a replay's) estimate as the prior; the orchestrator dispatches and orders by "
        "it, and reports its recall@20% of group makespans as the run goes.",
    )
    decay: float = Field(0.5, ge=0.0, le=1.0, description="Weight of a visit's samples per later visit of the prompt.")
    prior_weight: float = Field(
        1.0, ge=0.0, le=1000.0, description="The ranker's estimate counts as this many samples of the prompt."
    )
    sigma: float = Field(
        0.5, gt=0.0, le=5.0,
        description="Spread of log lengths within a group until min_groups have closed (then the run's own, pooled).",
    )
    min_groups: int = Field(8, ge=1, le=1_000_000, description="Closed groups before the run's own spread is used.")
    recall_window: int = Field(
        256, ge=10, le=1_000_000,
        description="Recent closed groups over which the run reports the estimator's recall@20% of group makespans.",
    )
