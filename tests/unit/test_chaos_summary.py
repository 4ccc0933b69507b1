"""The chaos suite's bookkeeping (pure): totals, per-component recovery, the pass verdict."""

from __future__ import annotations

from bench.chaos import passed, summarize
from bench.chaos_run import RunResult, recovery_seconds, staleness_violations


def _run(name, faults, recovery=None, completed=True, lost=0, dup=0, violations=0, weights_ok=True, config="bounded",
         readmitted=None, trajectories_lost=0, revivals=None, ledger_ok=True, rolled_back=None):
    readmitted = int("kill:sgs" in faults) if readmitted is None else readmitted
    rolled_back = int("kill:trainer" in faults) if rolled_back is None else rolled_back
    revivals = [{"replayed_steps": 1}] if revivals is None and "kill:learner" in faults else revivals or []
    return RunResult(name, completed=completed, faults=faults, recovery_s=recovery, samples_lost=lost,
                     duplicates=dup, violations=violations, weights={"ok": weights_ok}, config=config,
                     instances_readmitted=readmitted, trajectories_lost=trajectories_lost, learner_revivals=revivals,
                     ledger={"ok": ledger_ok}, rolled_back_groups=rolled_back)


def test_summary_counts_faults_and_groups_recovery_by_component_and_pair():
    s = summarize([
        _run("a", ["kill:sgs"], 1.0), _run("b", ["kill:sgs"], 3.0), _run("c", ["kill:relay", "kill:trainer"], 4.0),
        _run("d", ["net:reset"], 0.5), _run("e", ["net:delay"]),
    ])
    assert s["faults_injected"] == {"kill:sgs": 2, "kill:relay": 1, "kill:trainer": 1, "net:reset": 1, "net:delay": 1}
    assert s["faults_total"] == 6 and s["runs"] == s["runs_completed"] == 5
    assert s["recovery_s"]["sgs"] == {"median": 2.0, "max": 3.0, "n": 2}
    assert s["recovery_s"]["relay+trainer"]["n"] == 1 and s["recovery_s"]["net_reset"]["max"] == 0.5
    assert "net_delay" not in s["recovery_s"]  # no recovery time for a fault present all along
    assert passed(s)


def test_any_loss_duplicate_violation_mismatch_or_failed_run_fails_the_suite():
    base = [_run("a", ["kill:sgs"], 1.0)]
    assert passed(summarize(base))
    for bad in (_run("x", ["kill:relay"], lost=4), _run("x", ["kill:relay"], dup=1),
                _run("x", ["kill:relay"], violations=1), _run("x", ["kill:relay"], weights_ok=False),
                _run("x", ["kill:relay"], completed=False)):
        assert not passed(summarize([*base, bad])), bad
    flaky = {**summarize(base), "flaky_test": {"runs": 20, "passed": 19}}
    assert not passed(flaky)


def test_trajectory_totals_part_the_learner_from_the_whole_trainer_process_and_readmissions_by_mode():
    s = summarize([
        _run("l", ["kill:learner"]), _run("ls", ["kill:sgs", "kill:learner"], config="sync"),
        _run("t", ["kill:trainer"], trajectories_lost=24), _run("s", ["kill:sgs"], config="agentic", readmitted=2),
    ])
    assert s["trajectories_lost_on_trainer_kill"] == 0 and s["trajectories_lost_on_trainer_process_kill"] == 24
    assert [k["scenario"] for k in s["learner_kills"]] == ["l", "ls"]
    assert s["instances_readmitted"] == {"sync": 1, "agentic": 2}
    assert passed(s)  # a whole-process kill may roll back; the learner's may not


def test_a_lost_trajectory_a_missing_readmission_or_an_unreplayed_learner_kill_fails_the_suite():
    base = [_run("a", ["kill:sgs"], 1.0)]
    for bad in (_run("x", ["kill:learner"], trajectories_lost=8), _run("x", ["kill:sgs"], config="sync", readmitted=0),
                _run("x", ["kill:learner"], revivals=[{"replayed_steps": 0}])):
        assert not passed(summarize([*base, bad])), bad


def test_a_broken_ledger_or_a_trainer_kill_that_rolled_nothing_back_fails_the_suite():
    base = [_run("a", ["kill:sgs"], 1.0), _run("t", ["kill:trainer"], 2.0)]
    s = summarize(base)
    assert s["ledger_ok"] and s["rollback_exercised"] and s["rolled_back_groups"] == {"t": 1} and passed(s)
    s = summarize([*base, _run("x", ["kill:relay"], ledger_ok=False)])
    assert not s["ledger_ok"] and s["ledger_failures"] == ["x"] and not passed(s)
    s = summarize([*base, _run("y", ["kill:relay", "kill:trainer"], rolled_back=0)])  # it landed on a checkpoint
    assert s["rollback_exercised"] is False and not passed(s)
    assert summarize([_run("a", ["kill:sgs"])])["rollback_exercised"] is None  # no trainer kill: nothing to judge


def test_recovery_is_measured_to_the_first_step_finished_after_the_fault():
    rows = [{"t_end": 10.0}, {"t_end": 12.5}, {"t_end": 14.0}]
    assert recovery_seconds(rows, 11.0) == 1.5
    assert recovery_seconds(rows, 20.0) is None and recovery_seconds(rows, None) is None


def test_violations_use_the_bound_counter_where_the_mode_has_one():
    assert staleness_violations([{"bound_violations": 2, "staleness_max": 9}, {"bound_violations": 0}], 2) == 2
    assert staleness_violations([{"staleness_max": 1}, {"staleness_max": 2}], 1) == 1
