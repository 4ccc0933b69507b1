"""The rollout orchestrator: everything between the SGS instances and the learner.

Routes work to instances (``fleet.Fleet``, the one table of instances and the place that picks one),
collects samples and trajectories, scores them through the reward service (``rewards``), stages
experience under the staleness bound (``staleness``, ``pools``, ``lifecycle``), hands the head
buffer's groups to the learner (``head``), and syncs instances to new weights (``publisher``).
Every pipeline mode is a value of eta (``modes``); single-turn groups (``orchestrator``) and
multi-turn trajectories (``agentic``) are two workflows of one group lifecycle.
"""
