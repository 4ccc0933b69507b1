"""Ranker models; importing this package registers every kind (heavy imports stay lazy)."""

from ranker.models import baselines, causal_lm, ensemble, gbm, transformer  # noqa: F401
