"""User reward functions for tests/integration/test_suites_run.py, imported by path (reward.python_path).

``brevity`` is the training reward: the shorter the completion, the higher (GRPO pushes every answer
shorter). ``long_answer`` and ``short_answer`` are the two evaluation suites' terms: correct when the
completion has at least ``LONG`` characters, or fewer. Training on ``brevity`` pushes against the first
(built to be forgotten) and for the second (never flagged: it can only rise).
"""

LONG = 8  # characters: the warm start's greedy count-down answers are mostly 9 ("102,99#99"), some 5 ("99#99")


def brevity(completion, **_):
    return 1.0 - min(len(completion), 64) / 64.0


def long_answer(completion, **_):
    return {"reward": 0.0, "correct": len(completion) >= LONG}


def short_answer(completion, **_):
    return {"reward": 0.0, "correct": len(completion) < LONG}
