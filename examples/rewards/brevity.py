"""An example of your own reward function for a dataset task (docs/reward.md).

Use it from a run config with this directory on the reward workers' import path::

    reward:
      python_path: [examples/rewards]
      terms:
        - fn: brevity:correct_and_brief

Braid calls the function once per sample with keyword arguments ``completion`` (the model's
text), ``answer`` (the row's reference answer as text), ``prompt`` (the row's prompt text) and
``row`` (the whole dataset row as a dict); ``**_`` swallows the ones a function does not use.
It returns a finite number, or a mapping with ``reward`` (a finite number), optionally
``correct`` (a bool, counted as accuracy) and other str/int/float/bool values reported as info.

This module depends on nothing but the standard library, as a reward module should: it runs
inside the reward workers, whatever else is installed there.
"""

from __future__ import annotations

import re
from fractions import Fraction

FREE_CHARS = 200  # characters of completion that cost nothing
PENALTY_PER_CHAR = 0.001  # reward lost per character beyond FREE_CHARS

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> Fraction | None:
    """The last number written in ``text`` (commas as thousands separators), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return Fraction(found[-1].replace(",", ""))
    except ValueError:
        return None


def correct_and_brief(completion: str, answer: str, prompt: str, row: dict, **_: object) -> dict[str, object]:
    """1 for a right final number, minus 0.001 per character beyond the first 200.

    The final number of the completion is compared with the final number of the reference answer
    (a worked solution ending in ``#### 72`` and a plain ``72`` both work).
    """
    expected = last_number(answer)
    correct = expected is not None and last_number(completion) == expected
    overflow = max(0, len(completion) - FREE_CHARS)
    return {
        "reward": (1.0 if correct else 0.0) - PENALTY_PER_CHAR * overflow,
        "correct": correct,
        "chars": len(completion),
    }


def always_raises(**_: object) -> float:
    """Raises ValueError("boom") on every call: used by the tests of how failed rewards are reported and counted."""
    raise ValueError("boom")


def bad_value(**_: object) -> object:
    """Returns a string, which is not a reward: used by the tests of how bad return values are reported and counted."""
    return "not a number"
