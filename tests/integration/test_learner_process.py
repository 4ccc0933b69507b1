"""The learner in a process of its own (``services.run.learner_process``): it trains exactly as the
learner in the trainer's own process, and a learner killed between two checkpoints is replaced and
brought back to the same weights by replaying the steps since the last one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest
import torch

from services.common.config import load_config
from services.common.types import SampleRecord
from services.policy.model import load_policy
from services.run.learner_process import LearnerDied, LearnerProcess
from services.trainer.learner import Group, Learner
from tests.conftest import ROOT

# this test process has run torch operations (OpenMP threads): its learners are spawned; the
# trainer process forks its first one before any (the last test checks that path)
START = "spawn"


def _groups(step: int) -> list[Group]:
    out = []
    for g in range(3):
        gen = torch.Generator().manual_seed(100 * step + g)
        samples = []
        for i in range(4):
            n = int(torch.randint(2, 9, (1,), generator=gen))
            tokens = tuple(int(t) for t in torch.randint(3, 18, (n,), generator=gen))
            samples.append(SampleRecord(f"p{step}-{g}", f"p{step}-{g}", i, (1, 5, 6), tokens,
                                        tuple(-1.5 - 0.1 * k for k in range(n)), step, "stop", 0.0, 0.0, 0.0))
        out.append(Group(samples, [float(i % 2) for i in range(4)]))
    return out


@pytest.fixture
def cfg():
    return load_config(ROOT / "deploy/configs/smoke.yaml", ["trainer.lr=0.01"])


def _train(learner, steps: range) -> list[float]:
    norms = []
    for k in steps:
        learner.begin()
        for group in _groups(k):
            learner.backward([group])
        norms.append(learner.step())
    learner.begin()
    return norms


def _weights(learner) -> dict[str, torch.Tensor]:
    return learner.weights().host_copies()


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


# with trainer.lora the weights are the adapter's (slow: ~70 s here, as the full-weights case)
@pytest.mark.parametrize("lora", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_learner_process_trains_as_the_inline_learner_and_a_killed_one_is_replayed_to_the_same_weights(
        cfg, tiny_checkpoint, tmp_path, lora):
    """Same weights as the learner in this process, step by step; killed between two checkpoints
    (versions 3 and 4 published since the one at 2), it is replaced and replays them exactly."""
    if lora:
        cfg = load_config(ROOT / "deploy/configs/smoke.yaml", ["trainer.lr=0.01", "trainer.lora.rank=4"])
    torch.manual_seed(cfg.trainer.seed)
    inline = Learner(cfg, load_policy(str(tiny_checkpoint)))
    revived = []
    proc = LearnerProcess(cfg, str(tiny_checkpoint), tmp_path, max_restarts=2, on_revive=revived.append,
                          start=START)
    try:
        _same(_weights(proc), _weights(inline))
        assert _train(proc, range(2)) == _train(inline, range(2))
        assert proc.stats.trained_samples == 0  # begin() cleared it, as the inline learner's
        _same(_weights(proc), _weights(inline))
        assert int((tmp_path / "learner.pid").read_text()) == proc.pid
        with pytest.raises(RuntimeError, match="unknown learner command"):  # a failure is raised, not retried
            proc._call("bogus")
        proc.state()  # a recovery checkpoint at version 2: the base
        _train(proc, range(2, 4))
        first = proc.pid
        os.kill(first, signal.SIGKILL)
        _train(proc, range(4, 5))
        assert proc.pid != first
        assert [(r.replayed_steps, r.replayed_groups, r.replayed_samples) for r in revived] == [(2, 6, 24)]
        _train(inline, range(2, 5))
        _same(_weights(proc), _weights(inline))
        assert all(".lora_" in k for k in _weights(proc)) == lora
    finally:
        proc.close()


@pytest.mark.long  # `make test-long` (CI runs it; docs/testing.md)
def test_a_learner_that_keeps_dying_ends_the_run(cfg, tiny_checkpoint, tmp_path):
    proc = LearnerProcess(cfg, str(tiny_checkpoint), tmp_path, max_restarts=0, start=START)
    try:
        proc.begin()
        os.kill(proc.pid, signal.SIGKILL)
        with pytest.raises(LearnerDied, match="max_restarts"):
            proc.backward(_groups(0))
    finally:
        proc.close()


def test_the_learner_process_ends_when_the_trainer_process_is_killed(cfg, tiny_checkpoint, tmp_path):
    """The forked learner must not hold the trainer's end of its pipe open: with the trainer
    killed -9 its pipe closes and it exits (no orphan learner left behind)."""
    code = (f"from services.common.config import load_config\n"
            f"from services.run.learner_process import LearnerProcess\n"
            f"p = LearnerProcess(load_config({str(ROOT / 'deploy/configs/smoke.yaml')!r}), {str(tiny_checkpoint)!r}, "
            f"__import__('pathlib').Path({str(tmp_path)!r}), max_restarts=0)\n"
            f"p.begin(); print(p.pid, flush=True); __import__('time').sleep(600)\n")
    trainer = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        pid = int(trainer.stdout.readline())
        trainer.kill()
        trainer.wait(timeout=30)
        child = psutil.Process(pid)
        child.wait(timeout=30)  # psutil.TimeoutExpired: the learner outlived its trainer
    finally:
        trainer.kill()


def test_a_learner_that_cannot_start_says_why(cfg, tmp_path):
    proc = LearnerProcess(cfg, str(tmp_path / "no-such-checkpoint"), tmp_path, max_restarts=3, start=START)
    try:
        with pytest.raises(RuntimeError, match="failed to start"):
            proc.begin()
        assert proc.revivals == []  # not retried: another start would fail the same way
    finally:
        proc.close()
