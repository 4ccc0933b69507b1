"""Write the arithmetic word-question dataset of deploy/configs/smollm2-arith.yaml (train.jsonl, test.jsonl).

Natural-language arithmetic a 135M instruct model solves sometimes: two-digit addition (about one
in ten at temperature 0.6 for SmolLM2-135M-Instruct), one-digit addition and multiplication
tables (about two in five) and small subtractions (about one in five), each family asked in four
phrasings. Rows: ``{"question": ..., "answer": <int>, "family": ...}``. The test file's 1000
questions are distinct and never occur in the train file (which repeats some small-family ones).
Deterministic: ``python deploy/data/arith-nl/make.py`` rewrites both files byte for byte.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAMILIES = {  # name: (share of rows, operand ranges, operation, phrasings)
    "add2": (0.45, (10, 99), (10, 99), lambda a, b: a + b,
             ("What is {a} + {b}?", "What is {a} plus {b}?", "Add {a} and {b}.", "Calculate {a} + {b}.")),
    "add1": (0.15, (1, 9), (1, 9), lambda a, b: a + b,
             ("What is {a} + {b}?", "What is {a} plus {b}?", "Add {a} and {b}.", "Calculate {a} + {b}.")),
    "mul1": (0.2, (2, 9), (2, 9), lambda a, b: a * b,
             ("What is {a} times {b}?", "What is {a} * {b}?", "Multiply {a} by {b}.", "Calculate {a} x {b}.")),
    "sub": (0.2, (10, 20), (1, 9), lambda a, b: a - b,
            ("What is {a} minus {b}?", "What is {a} - {b}?", "Subtract {b} from {a}.", "Calculate {a} - {b}.")),
}
TRAIN_ROWS, TEST_ROWS = 6000, 1000


def draw(rng: random.Random, n: int, exclude: frozenset[str], unique: bool) -> list[dict]:
    rows: list[dict] = []
    seen: set[str] = set()
    names = list(FAMILIES)
    weights = [FAMILIES[f][0] for f in names]
    while len(rows) < n:
        family = rng.choices(names, weights)[0]
        _, (a0, a1), (b0, b1), op, phrasings = FAMILIES[family]
        a, b = rng.randint(a0, a1), rng.randint(b0, b1)
        question = rng.choice(phrasings).format(a=a, b=b)
        if question not in exclude and not (unique and question in seen):
            seen.add(question)
            rows.append({"question": question, "answer": op(a, b), "family": family})
    return rows


def main() -> None:
    rng = random.Random(20261126)
    test = draw(rng, TEST_ROWS, frozenset(), unique=True)
    train = draw(rng, TRAIN_ROWS, frozenset(r["question"] for r in test), unique=False)
    for name, rows in (("train.jsonl", train), ("test.jsonl", test)):
        (HERE / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
