"""When a run scores its suites (``services.run.evaluations``), over a fake held-out side that answers
hand-made accuracies: the warm start once (and read back when resumed), only the suites due between
steps after the fleet was brought to the step's weights, the flags, the stop, and a final evaluation
that does not score the same weights twice."""

from __future__ import annotations

import json
import math

from services.common.config import load_config
from services.run.evaluate import EvalResult
from services.run.evaluations import Evaluations
from services.run.suites import Suite
from tests.conftest import ROOT


def _suite(name: str, every: int) -> Suite:
    return Suite(name, [], every, 0.0, 0.0, 0, "fp")


class FakeHeld:
    """The ``HeldOut`` side: each suite's accuracy per weight version, scored calls and offers recorded."""

    def __init__(self, accuracy: dict[str, dict[int, float]], *sets: str) -> None:
        self.cfg = load_config(ROOT / "deploy/configs/smoke.yaml", ["trainer.iterations=6", *sets])
        self.suites = [_suite("heldout", 0), _suite("keep", 2), _suite("lose", 3)]
        self.accuracy, self.version, self.scored, self.offered = accuracy, 0, [], []
        self.publisher = self

    def offer_missing(self, version: int, snapshot) -> None:
        self.offered.append(version)

    def evaluate(self, tag: str) -> EvalResult:
        return self.evaluate_suite(self.suites[0], tag)

    def evaluate_suite(self, suite: Suite, tag: str) -> EvalResult:
        self.scored.append((suite.name, self.version, tag))
        p = self.accuracy[suite.name][self.version]
        return EvalResult(self.version, 100, p, math.sqrt(p * (1 - p) / 100), 9.0, {})


ACCURACY = {"heldout": {0: 0.2, 3: 0.4, 6: 0.5}, "keep": {0: 0.6, 2: 0.6, 3: 0.61, 4: 0.62, 6: 0.6},
            "lose": {0: 0.7, 3: 0.3, 6: 0.2}}


def test_the_warm_start_is_scored_once_and_read_back_when_resumed(tmp_path):
    held = FakeHeld(ACCURACY)
    before = Evaluations(held, tmp_path).warm_start(resumed=False)
    assert list(before) == ["heldout", "keep", "lose"] and before["lose"].accuracy == 0.7
    assert [s[2] for s in held.scored] == ["eval-warmstart", "eval-warmstart-keep", "eval-warmstart-lose"]
    again = FakeHeld(ACCURACY)
    assert Evaluations(again, tmp_path).warm_start(resumed=True) == before and again.scored == []


def test_between_steps_only_the_due_suites_are_scored_after_the_fleet_takes_the_step(tmp_path):
    held = FakeHeld(ACCURACY)
    ev = Evaluations(held, tmp_path)
    ev.warm_start(resumed=False)
    held.scored.clear()
    rows = {}
    for v in range(1, 7):
        held.version = v
        rows[v] = ev.between_steps(v, snapshot=None)
    assert [(n, v) for n, v, _ in held.scored] == [("keep", 2), ("lose", 3), ("keep", 4)]  # 6 is the end's
    assert held.offered == [2, 3, 4] and rows[1] == rows[5] == {}
    assert rows[3]["suite_accuracy"] == {"lose": 0.3} and rows[3]["suites_forgotten"] == 1
    assert rows[3]["forgetting"][0]["suite"] == "lose" and rows[4]["forgetting"] == [] and ev.stop is None


def test_a_flag_stops_the_run_under_stop_on_forgetting_and_the_end_reuses_that_evaluation(tmp_path):
    held = FakeHeld(ACCURACY, "eval.stop_on_forgetting=true")
    ev = Evaluations(held, tmp_path)
    ev.warm_start(resumed=False)
    for v in (1, 2, 3):
        held.version = v
        ev.between_steps(v, snapshot=None)
    assert ev.stop == {"weight_version": 3, "reason": "eval.stop_on_forgetting", "suites": ["lose"]}
    held.scored.clear()
    after = ev.final()  # the run ends at version 3: "lose" was scored there already
    assert [n for n, _, _ in held.scored] == ["heldout", "keep"] and after["lose"].accuracy == 0.3
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"suite_eval_s": 1.5, "forgetting": [{"suite": "lose"}]}) + "\n")
    part = ev.summary(after, 3)
    assert [f["suite"] for f in part["forgetting"]] == ["lose"] and part["suites_forgotten"] == 1
    assert part["forgetting_between_steps"] == [{"suite": "lose"}] and part["suite_eval_seconds"] == 1.5
    assert part["suites"]["lose"]["before"]["accuracy"] == 0.7 and part["suites"]["keep"]["every"] == 2
    assert part["stopped_early"] == ev.stop
