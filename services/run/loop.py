"""The RL trainer: consumes SGS sample streams, takes RL steps, publishes weights.

``RLTrainer`` is the run (``runtime.TrainerRuntime``: config, learner, SGS clients, weight
publisher, version, metrics) and runs ``trainer.iterations`` through the rollout orchestrator
(``services.rollout.orchestrator``), whose one path serves every ``trainer.mode`` as a value of
the staleness bound eta (``services.rollout.modes``).

Weights leave through ``WeightPublisher`` (background push through the configured weight
transport: the relay plane or direct streams), so the trainer stalls only for a snapshot copy.
Every iteration appends a line to ``metrics.jsonl``; the stage intervals go to
``timeline.json``; evaluation before and after RL goes to ``summary.json``.
"""

from __future__ import annotations

from services.rollout.orchestrator import Orchestrator
from services.run.runtime import TrainerRuntime


class RLTrainer(TrainerRuntime):
    """With ``agentic.enabled`` the trainer process sets ``rollout`` (``agentic_setup.build_rollout``):
    iterations run ``agentic.AgenticRunner`` and evaluation plays the held-out episodes
    (``heldout.HeldOut.evaluate``)."""

    def run_iterations(self, progress=None) -> None:
        """``trainer.iterations`` optimizer steps in ``trainer.mode``; ``progress(k, row)`` after each."""
        if self.cfg.agentic.enabled:
            from services.rollout.agentic import AgenticRunner

            AgenticRunner(self, self._rollout(), self.agentic_eval).run(self.cfg.trainer.iterations, progress)
            return
        Orchestrator(self).run(self.cfg.trainer.iterations, progress)
