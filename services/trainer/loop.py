"""The RL trainer: consumes SGS sample streams, takes RL steps, publishes weights.

``RLTrainer`` is the run (``runtime.TrainerRuntime``: config, learner, SGS clients, weight
publisher, version, metrics) and runs ``trainer.iterations`` with the runner of
``trainer.mode``: ``lockstep`` (``sequential``, ``sync``, ``one_step``) or ``bounded``
(trajectory-level asynchrony under the staleness bound). The runners are peers: each sees only
the runtime.

Weights leave through ``WeightPublisher`` (background push through the configured weight
transport: the relay plane or direct streams), so the trainer stalls only for a snapshot copy.
Every iteration appends a line to ``metrics.jsonl``; the stage intervals go to
``timeline.json``; evaluation before and after RL goes to ``summary.json``.
"""

from __future__ import annotations

from services.trainer.bounded import BoundedRunner
from services.trainer.lockstep import LockstepRunner
from services.trainer.runtime import TrainerRuntime

RUNNERS = {"sequential": LockstepRunner, "sync": LockstepRunner, "one_step": LockstepRunner, "bounded": BoundedRunner}


class RLTrainer(TrainerRuntime):
    def run_iterations(self, progress=None) -> None:
        """``trainer.iterations`` optimizer steps in ``trainer.mode``; ``progress(k, row)`` after each."""
        RUNNERS[self.cfg.trainer.mode](self).run(self.cfg.trainer.iterations, progress)
