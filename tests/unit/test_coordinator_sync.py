"""The StaleFlow cycle's Alg. 4 trigger (``services.rollout.coordination.Coordinator.to_sync``): once
per snapshot and version, and again at once when the speculative state shows an instance emptied
behind the newest version (not up to ``interval_s`` later, when the next snapshot is due)."""

from __future__ import annotations

from pathlib import Path

from services.common.config import load_config
from services.rollout.coordination import Coordinator
from services.rollout.staleflow import Load, Traj
from services.rollout.staleness import StalenessManager

CONFIG = Path(__file__).resolve().parents[2] / "deploy/configs/emulated.yaml"


def test_alg4_runs_again_when_an_instance_empties_between_snapshots():
    cfg = load_config(CONFIG, ["trainer.mode=bounded", "trainer.eta=2", "trainer.coordination.policy=staleflow",
                               "trainer.partial_rollout=true"])
    coord = Coordinator(cfg, "", group_samples=8)
    mgr = StalenessManager(eta=0, batch_size=16, group_size=8, start_version=1)  # only version 1 reserves
    trajs = [Traj("a", None, 100, 8), Traj("b", None, 100, 8)]
    busy = [Load(0, 0, 16, 0, 1600.0, 64), Load(1, 0, 40, 0, 4000.0, 64)]
    assert coord.to_sync(busy, trajs, 1, mgr) == [0]  # the least loaded takes the new version's work
    assert coord.to_sync(busy, trajs, 1, mgr) == []  # the same snapshot and version: decided already
    emptied = [busy[0], Load(1, 0, 0, 0, 0.0, 64)]  # instance 1's samples finished since the snapshot
    assert coord.to_sync(emptied, trajs, 1, mgr) == [1]  # looked at at once: it syncs, idle, first
    assert coord.to_sync(emptied, trajs, 1, mgr) == []
