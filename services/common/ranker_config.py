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
    kind: str = Field("lightgbm", max_length=64, description="Ranker kind (ranker.base.kinds(); checked when the run is prepared).")
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword parameters of the kind (causal_lm: base_path defaults to the run's policy checkpoint).",
    )
    n_recent: int = Field(20_000, ge=20, le=10_000_000, description="Train on the N most recent finished samples.")
    min_samples: int = Field(200, ge=10, le=10_000_000, description="Fewest logged samples a retrain needs (else it waits).")
    holdout_fraction: float = Field(
        0.1, gt=0.0, le=0.5, description="Newest fraction of the samples held out to compare the old and new ranker."
    )
