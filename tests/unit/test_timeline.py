from services.trainer.timeline import covered, idle, overlap, union


def test_union_and_idle():
    assert union([(3, 4), (0, 1), (0.5, 2)]) == [(0, 2), (3, 4)]
    assert covered([(0, 1), (0.5, 2), (3, 4)], (1, 3.5)) == 1.5
    assert idle([(0, 1), (3, 4)], (0, 4)) == 2
    assert overlap((0, 2), (1, 3)) == 1 and overlap((0, 1), (2, 3)) == 0
