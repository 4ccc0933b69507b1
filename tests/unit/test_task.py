import statistics

from services.tasks.arith import Problem, ProblemSampler, demonstration, eval_problems, reward


def test_demonstration_solves_and_verifier_checks():
    p = Problem("x", n=247, d=9, m=200)
    assert demonstration(p) == "238,229,220,211,202,193#193"
    assert p.difficulty == 6 and p.answer == 193
    assert reward(p, demonstration(p)) == 1.0
    assert reward(p, "238,229#229") == 0.0
    assert reward(p, "238,229,220") == 0.0  # no answer
    assert reward(p, "#193 ") == 1.0  # only the stated answer counts


def test_every_sampled_problem_has_the_drawn_number_of_steps():
    for p in ProblemSampler(3).batch(2000):
        assert 1 <= p.difficulty <= 40
        assert demonstration(p).count(",") == p.difficulty - 1
        assert p.answer <= p.m < p.answer + p.d


def test_output_lengths_have_a_long_tail():
    lengths = sorted(len(demonstration(p)) for p in ProblemSampler(0).batch(20000))
    p99 = lengths[int(0.99 * len(lengths))]
    assert p99 >= 8 * statistics.median(lengths)


def test_eval_set_is_fixed_by_seed_and_excluded_from_training():
    a = eval_problems(7, 200)
    assert [p.prompt for p in a] == [p.prompt for p in eval_problems(7, 200)]
    assert [p.prompt for p in a] != [p.prompt for p in eval_problems(8, 200)]
    held = frozenset(p.prompt for p in a)
    train = ProblemSampler(7, exclude=held).batch(5000)
    assert not held & {p.prompt for p in train}
