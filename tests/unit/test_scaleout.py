"""The scale-out policy (allocator/scaleout.py) on hand-made per-iteration timings."""

from __future__ import annotations

import pytest

from allocator.scaleout import IterationTiming, ScaleoutLimits, added_by_one_fewer, decide, saved_by_one_more

LIMITS = ScaleoutLimits(min_instances=1, max_instances=3, window=2, cooldown=2, scale_in_margin=0.25)


def timings(rows: list[tuple[float, float]], instances: int = 1, start: int = 0) -> list[IterationTiming]:
    return [IterationTiming(start + i, g, t, instances) for i, (g, t) in enumerate(rows)]


def test_delta_prime_is_the_ideal_dp_saving():
    assert saved_by_one_more(12.0, 1) == pytest.approx(6.0)
    assert saved_by_one_more(12.0, 2) == pytest.approx(4.0)
    assert added_by_one_fewer(12.0, 3) == pytest.approx(6.0)


def test_scales_out_when_delta_reaches_delta_prime():
    # T_gen 10, T_train 4: delta 6 >= delta' 10/2 = 5
    d = decide(timings([(10, 4), (10, 4)]), 1, LIMITS)
    assert d.action == "out" and d.instances == 2
    assert d.delta_s == pytest.approx(6.0) and d.delta_prime_s == pytest.approx(5.0)


def test_no_trigger_below_delta_prime():
    # delta 4 < delta' 5: one more unit would make generation faster than training by more than it saves
    d = decide(timings([(10, 6), (10, 6)]), 1, LIMITS)
    assert d.action == "hold" and d.instances == 1 and "<" in d.reason


def test_one_noisy_iteration_does_not_trigger():
    rows = [(10, 7), (10, 7), (10, 7), (16, 7)]  # one slow iteration: 16 - 7 = 9 >= 16 / 2
    assert decide(timings(rows), 1, ScaleoutLimits(window=1, cooldown=0)).action == "out"
    d = decide(timings(rows), 1, ScaleoutLimits(window=3, cooldown=0))  # mean T_gen 12: delta 5 < 6
    assert d.action == "hold" and d.delta_s == pytest.approx(5.0)


def test_warming_up_needs_a_full_window():
    d = decide(timings([(10, 1)]), 1, LIMITS)
    assert d.action == "hold" and d.delta_s is None and "warming up" in d.reason


def test_cooldown_after_a_change_and_only_iterations_at_the_current_count():
    history = timings([(10, 4)] * 3) + timings([(10, 4), (10, 4)], instances=2, start=3)
    d = decide(history, 2, LIMITS, last_change=2)  # iterations 3, 4 are inside the cooldown (<= 2 + 2)
    assert d.action == "hold" and "cooldown" in d.reason
    history += timings([(10, 4), (10, 4)], instances=2, start=5)  # 5, 6 at 2 instances: delta 6 >= 10/3
    d = decide(history, 2, LIMITS, last_change=2)
    assert d.action == "out" and d.instances == 3


def test_bounded_by_max_instances():
    d = decide(timings([(30, 1), (30, 1)], instances=3), 3, LIMITS)
    assert d.action == "hold" and d.instances == 3 and "max_instances" in d.reason


def test_scales_in_when_generation_is_far_ahead():
    # 2 instances, T_gen 2, T_train 5: one fewer adds 2/1 = 2; T_train - T_gen 3 >= 1.25 x 2
    d = decide(timings([(2, 5), (2, 5)], instances=2), 2, LIMITS)
    assert d.action == "in" and d.instances == 1
    # T_train - T_gen 2.2 < 2.5: hold (the margin prevents flapping)
    assert decide(timings([(2, 4.2), (2, 4.2)], instances=2), 2, LIMITS).action == "hold"


def test_never_below_min_instances_or_when_scale_in_is_off():
    assert decide(timings([(1, 50), (1, 50)]), 1, LIMITS).action == "hold"
    off = ScaleoutLimits(min_instances=1, max_instances=3, window=2, cooldown=2, scale_in=False)
    assert decide(timings([(2, 50), (2, 50)], instances=2), 2, off).action == "hold"


def test_bad_limits_and_counts_are_refused():
    with pytest.raises(ValueError, match="min_instances"):
        ScaleoutLimits(min_instances=3, max_instances=2)
    with pytest.raises(ValueError, match="window"):
        ScaleoutLimits(window=0)
    with pytest.raises(ValueError, match="current instance count"):
        decide([], 0, LIMITS)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["scaleout.min_instances=3", "scaleout.max_instances=2"], "min_instances (3) must be <= max_instances (2)"),
        (["scaleout.enabled=true", "generation.instances=5"], "must lie in [scaleout.min_instances"),
        (["scaleout.window=0"], "scaleout.window"),
        (["forced_length_ramp.start=8"], "needs generation.forced_lengths"),
        (["forced_length_ramp.per_iteration=4"], "needs forced_length_ramp.start > 0"),
        (["forced_length_ramp.start=8", "generation.forced_lengths=true", "trainer.partial_rollout=true"],
         "does not apply with trainer.partial_rollout"),
        (["forced_length_ramp.start=8", "forced_length_ramp.per_iteration=100", "generation.forced_lengths=true"],
         "above generation.max_new_tokens"),
    ],
)
def test_bad_scaleout_configs_name_the_field(overrides, match):
    from services.common.config import ConfigError, load_config
    from tests.conftest import ROOT

    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "deploy/configs/smoke.yaml", overrides)
    assert match in str(err.value)


def test_forced_length_ramp_grows_linearly():
    from services.common.config import ForcedLengthRamp

    ramp = ForcedLengthRamp(start=16, per_iteration=2.5)
    assert [ramp.length(k) for k in range(3)] == [16, 18, 21] and ForcedLengthRamp().length(7) == 0
    shrinking = ForcedLengthRamp(start=10, per_iteration=-4)
    assert [shrinking.length(k) for k in range(5)] == [10, 6, 2, 1, 1]  # never below one token


def test_a_shrinking_ramp_is_checked_where_it_is_longest():
    from services.common.config import ConfigError, load_config
    from tests.conftest import ROOT

    base = ["generation.forced_lengths=true", "forced_length_ramp.per_iteration=-8", "trainer.iterations=20"]
    assert load_config(ROOT / "deploy/configs/smoke.yaml", [*base, "forced_length_ramp.start=64"])
    with pytest.raises(ConfigError, match="reaches 65 tokens at iteration 0"):
        load_config(ROOT / "deploy/configs/smoke.yaml", [*base, "forced_length_ramp.start=65"])


def test_scale_in_never_removes_instances_the_controller_did_not_add(tmp_path):
    """Two-site mode: the generation site's own instances are not the controller's to remove."""
    from flows.scaleout import ScaleoutController
    from services.common.config import load_config
    from tests.conftest import ROOT

    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", ["scaleout.enabled=true", "scaleout.min_instances=1",
                                                          "generation.instances=2", "scaleout.max_instances=4"])
    site = ScaleoutController(tmp_path, cfg, "127.0.0.1:1", ["a:1", "b:2"], units=None, members=[])
    local = ScaleoutController(tmp_path, cfg, "127.0.0.1:1", ["a:1", "b:2"],
                               units=None, members=[("a:1", 0), ("b:2", 1)])
    try:
        assert (site.limits.min_instances, local.limits.min_instances) == (2, 1)
        assert site.next_index == local.next_index == 2
    finally:
        site.close()
        local.close()


def test_a_process_serving_several_instances_stops_when_the_last_of_them_has_left(tmp_path):
    """Scale-in removes one instance at a time; an emulated process serving several (``--instances``)
    must keep serving the others until every one of them has left."""
    from types import SimpleNamespace

    from flows.scaleout import ProcessUnits

    def process(name: str) -> SimpleNamespace:
        stopped: list[str] = []
        return SimpleNamespace(name=name, expect_exit=False, stopped=stopped,
                               proc=SimpleNamespace(terminate=lambda: stopped.append(name)))

    shared, single = process("sgs-0-1"), process("sgs-2")
    units = ProcessUnits(None, tmp_path, None, "ckpt", [], [("a:1", shared), ("a:2", shared), ("a:3", single)])
    units.stop(single)
    units.stop(shared)
    assert (single.stopped, shared.stopped, shared.expect_exit) == (["sgs-2"], [], False)
    units.stop(shared)
    assert (shared.stopped, shared.expect_exit) == (["sgs-0-1"], True)


def test_generation_time_is_net_of_overlap_with_the_previous_iteration():
    from allocator.scaleout import generation_time

    assert generation_time(10.0, 14.0, None) == pytest.approx(4.0)
    assert generation_time(10.0, 14.0, 12.5) == pytest.approx(1.5)  # started while the previous one ran
    assert generation_time(10.0, 14.0, 9.0) == pytest.approx(4.0)  # generation idle in between: not counted
    assert generation_time(10.0, 14.0, 15.0) == 0.0


def test_max_step_applies_the_rule_to_its_own_prediction():
    from allocator.scaleout import units_to_add

    # T_gen 30 at 8 units, T_train 10: the rule holds at 8 + j while 30 x 8 / (9 + j) >= 10, i.e. j <= 15
    assert units_to_add(30.0, 10.0, 8, 100) == 16
    assert units_to_add(30.0, 10.0, 8, 4) == 4
    assert units_to_add(10.0, 10.0, 8, 4) == 0  # one more unit would make generation faster than training
    rows = [(30, 10), (30, 10)]
    wide = ScaleoutLimits(max_instances=32, window=2, cooldown=0, max_step=8)
    assert decide(timings(rows, instances=8), 8, wide).instances == 16
    capped = ScaleoutLimits(max_instances=11, window=2, cooldown=0, max_step=8)
    assert decide(timings(rows, instances=8), 8, capped).instances == 11  # up to max_instances
    one = ScaleoutLimits(max_instances=32, window=2, cooldown=0)  # StreamRL's one unit per decision
    assert decide(timings(rows, instances=8), 8, one).instances == 9
    with pytest.raises(ValueError):
        ScaleoutLimits(max_step=0)


def test_emulated_scale_out_takes_several_standby_instances_at_once(tmp_path):
    """The emulated engine's pool (flows.scaleout.StandbyUnits): one decision of k units starts k standby
    instances together (one modelled start, not k), each joins the router in turn and is logged; a removed one
    goes back to the pool; the launcher keeps max_instances - instances standby, on the emulated engine only."""
    import json

    from flows.processes import standby_instances
    from flows.scaleout import ScaleoutController, StandbyUnits
    from services.common.config import load_config
    from tests.conftest import ROOT

    waits: list[float] = []
    units = StandbyUnits(["s:1", "s:2", "s:3"], 0.5, sleep=waits.append)
    cfg = load_config(ROOT / "deploy/configs/emulated.yaml",
                      ["generation.instances=2", "scaleout.enabled=true", "scaleout.max_instances=5",
                       "scaleout.max_step=4", "generation.dispatch.router='on'"])
    assert standby_instances(cfg) == 3
    assert standby_instances(load_config(ROOT / "deploy/configs/smoke.yaml", ["scaleout.enabled=true"])) == 0

    class Router:
        def __init__(self) -> None:
            self.routed = ["a:1", "a:2"]

        def add_instance(self, address: str, *, wait_s: float) -> tuple[list[str], int]:
            self.routed.append(address)
            return list(self.routed), 7

        def close(self) -> None:
            pass

    c = ScaleoutController(tmp_path, cfg, "127.0.0.1:1", ["a:1", "a:2"], units, [("a:1", "a:1"), ("a:2", "a:2")])
    real, c.router = c.router, Router()
    real.close()
    c._scale_out(4, 2)
    assert c.instances == ["a:1", "a:2", "s:1", "s:2"] and len(waits) == 2 and units.pool == ["s:3"]
    events = [json.loads(x) for x in (tmp_path / "scaleout.jsonl").read_text().splitlines()]
    assert [(e["address"], e["instances"], e["units"], e["standby"]) for e in events] == [
        ("s:1", 3, 2, True), ("s:2", 4, 2, True)]
    units.stop("s:2")
    assert units.pool == ["s:3", "s:2"]
    c.units = StandbyUnits([], 0.0)
    with pytest.raises(RuntimeError, match="no standby"):
        c._scale_out(5, 1)
