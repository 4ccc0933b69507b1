from services.run.timeline import covered, idle, overlap, union


def test_union_and_idle():
    assert union([(3, 4), (0, 1), (0.5, 2)]) == [(0, 2), (3, 4)]
    assert covered([(0, 1), (0.5, 2), (3, 4)], (1, 3.5)) == 1.5
    assert idle([(0, 1), (3, 4)], (0, 4)) == 2
    assert overlap((0, 2), (1, 3)) == 1 and overlap((0, 1), (2, 3)) == 0


def test_bounded_mode_counts_open_calls_as_busy_until_the_iteration_ends():
    """A sample still running when an iteration ends reports its interval only later: before
    this, such an iteration read as idle generation although work was in flight."""
    from services.rollout.orchestrator import _Call, _GroupState, open_call_intervals

    running = _Call(0, "g1", ["g1/0"], open=1, launched=10.0)
    returned = _Call(1, "g2", ["g2/0"], open=0, launched=5.0)
    groups = [_GroupState(problem=None, v_traj=0, calls=[running]),
              _GroupState(problem=None, v_traj=0, calls=[returned])]
    finished = [(5.0, 11.0)]  # the returned call's sample
    assert open_call_intervals(groups, 20.0) == [(10.0, 20.0)]
    assert idle(finished, (12.0, 20.0)) == 8.0  # finished samples alone: all idle
    assert idle(finished + open_call_intervals(groups, 20.0), (12.0, 20.0)) == 0.0
