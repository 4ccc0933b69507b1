"""Count-down by repeated subtraction: a verifiable task family with a long tail of lengths.

A prompt ``"247-9>200="`` asks: start at ``n = 247``, subtract ``d = 9`` while the value is
above ``m = 200``; where do you stop? A correct solution works through a scratchpad, one value
per step, then states the answer::

    238,229,220,211,202,193#193

The threshold ``m`` is a whole hundred (100..900), so deciding to stop means comparing the
hundreds digit with ``m``'s. Every step depends only on the previous value and on ``d`` and
``m`` (found by content in the prompt), so a small model can learn it, and the output length
grows linearly with the number of steps ``q = ceil((n - m) / d)``. ``q`` is drawn from a
truncated power law, P(q) ∝ q^-alpha on [min_steps, max_steps]; with the defaults the median
solution is 11 characters and the P99 one about 150: the long tail (P99/median ≈ 13) that
skewness-aware generation (StreamRL §5) is built for.

The verifier is rule based: reward 1 when the text after the last ``#`` is the true
final value, 0 otherwise (a missing or malformed answer scores 0). Everything here is pure and
seeded.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

ALPHABET = "0123456789->=,#"
_ANSWER = re.compile(r"#(\d+)\s*$")


@dataclass(frozen=True)
class Problem:
    """One prompt of the task: its id, start value, step and threshold."""

    prompt_id: str
    n: int
    d: int
    m: int

    # what every task item carries (services.tasks.source): the task tag, no system message, no group,
    # no reference text or row (the reward parses the problem from the prompt)
    task = "arith"
    system = None
    group = ""  # the evaluation breaks down by difficulty instead
    reference = ""
    row_json = ""

    @property
    def prompt(self) -> str:
        return f"{self.n}-{self.d}>{self.m}="

    @property
    def difficulty(self) -> int:
        """Number of subtractions the scratchpad needs."""
        return -((self.m - self.n) // self.d)

    @property
    def answer(self) -> int:
        return self.n - self.difficulty * self.d


def demonstration(problem: Problem) -> str:
    """The reference scratchpad solution (used for the supervised warm start)."""
    values = []
    x = problem.n
    while x > problem.m:
        x -= problem.d
        values.append(str(x))
    return ",".join(values) + f"#{x}"


def reward(problem: Problem, completion: str) -> float:
    """1.0 if the completion ends with ``#<correct final value>``, else 0.0."""
    match = _ANSWER.search(completion)
    return 1.0 if match is not None and int(match.group(1)) == problem.answer else 0.0


def step_weights(min_steps: int, max_steps: int, alpha: float) -> list[float]:
    """Unnormalised P(q) ∝ q^-alpha for q in [min_steps, max_steps]."""
    return [q**-alpha for q in range(min_steps, max_steps + 1)]


class ProblemSampler:
    """Seeded stream of problems; ``exclude`` keeps held-out prompts out of training."""

    def __init__(
        self,
        seed: int,
        *,
        min_steps: int = 1,
        max_steps: int = 40,
        alpha: float = 1.4,
        max_step: int = 9,
        max_value: int = 999,
        prefix: str = "p",
        exclude: frozenset[str] = frozenset(),
    ) -> None:
        if not 1 <= min_steps <= max_steps:
            raise ValueError(f"need 1 <= min_steps <= max_steps, got {min_steps}, {max_steps}")
        if not 2 <= max_step <= 9:
            raise ValueError(f"max_step must be in [2, 9], got {max_step}")
        if max_value < max_steps * max_step + 100:
            raise ValueError(f"max_value ({max_value}) must be >= max_steps * max_step + 100")
        self._rng = random.Random(seed)
        self._qs = list(range(min_steps, max_steps + 1))
        self._weights = step_weights(min_steps, max_steps, alpha)
        self._max_step = max_step
        self._max_value = max_value
        self._prefix = prefix
        self._exclude = exclude
        self._count = 0

    def sample(self) -> Problem:
        while True:
            q = self._rng.choices(self._qs, weights=self._weights)[0]
            d = self._rng.randint(2, self._max_step)
            m = 100 * self._rng.randint(1, (self._max_value - q * d) // 100)
            n = m + (q - 1) * d + self._rng.randint(1, d)  # exactly q steps: ceil((n-m)/d) == q
            problem = Problem(prompt_id=f"{self._prefix}{self._count}", n=n, d=d, m=m)
            if problem.prompt not in self._exclude:
                self._count += 1
                return problem

    def batch(self, n: int) -> list[Problem]:
        return [self.sample() for _ in range(n)]

    def state(self) -> tuple:
        """The data cursor: what ``restore`` needs to draw the same problems from here on."""
        return self._rng.getstate(), self._count

    def restore(self, state: tuple) -> None:
        rng, self._count = state
        self._rng.setstate(rng)


def eval_problems(seed: int, n: int, **dist: int | float) -> list[Problem]:
    """The held-out evaluation set: fixed by ``seed``, ids prefixed ``e``."""
    return ProblemSampler(seed, prefix="e", **dist).batch(n)  # type: ignore[arg-type]


def fingerprint(problems: list[Problem]) -> str:
    """Short digest of a problem set (recorded in the run summary)."""
    h = hashlib.sha256("\n".join(p.prompt for p in problems).encode())
    return h.hexdigest()[:16]


_PROMPT = re.compile(r"(\d{1,9})-(\d{1,9})>(\d{1,9})=")


def parse_prompt(text: str) -> Problem | None:
    """The problem a prompt states (the inverse of ``Problem.prompt``), or None when ``text`` is not a
    count-down prompt: ``n-d>m=`` with 1..9-digit numbers, ``d >= 1`` and ``n > m``."""
    match = _PROMPT.fullmatch(text)
    if match is None:
        return None
    n, d, m = (int(g) for g in match.groups())
    return Problem(prompt_id="", n=n, d=d, m=m) if d >= 1 and n > m else None
