"""The trainer process of one RL run (``python -m services.run``): the rollout orchestrator
(``services.rollout``) and the learner (``services.trainer``) composed, with what the run keeps
around them: the weight transport, recovery checkpoints and the consumption ledger, metrics,
the stage timeline and evaluation."""
