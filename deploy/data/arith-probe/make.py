"""Write the out-of-distribution suites of deploy/configs/smollm2-arith.yaml (eval.suites): one file per family.

The run trains on deploy/data/arith-nl (short questions: "What is 23 + 45?", "Multiply 4 by 7.", one-
and two-digit operands). These families ask arithmetic the training data does not, to see what RL on
it does to the rest of the model's arithmetic (issue 57's probe: base -> trained, greedy, 100 questions
each: bare equations 0.09 -> 0.65, three-digit sums 0.01 -> 0.22, addition word problems 0.00 -> 0.18,
word-problem multiplication 0.72 -> 0.35):

- ``equations.jsonl``: a bare equation to complete, "23 + 45 =" (two-digit operands, no question words);
- ``add3.jsonl``: three-digit sums, "What is 345 + 678?" (operands the training data never has);
- ``word-add.jsonl``: two-digit addition as a short story ("Tom has 23 apples and buys 45 more. ...");
- ``word-mul.jsonl``: one-digit multiplication as a short story ("A box holds 6 pencils. How many
  pencils are in 7 boxes?"), the family the base model already does well.

Rows: ``{"question": ..., "answer": <int>, "family": ...}``, ``ROWS`` distinct questions per file, none
of them a question of arith-nl's train or test file. Generated here from templates (no outside data;
the project's own license). Deterministic: ``python deploy/data/arith-probe/make.py`` rewrites every
file byte for byte.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARITH_NL = HERE.parent / "arith-nl"
ROWS = 200
OBJECTS = ("apples", "stamps", "marbles", "books", "stickers", "coins")
PEOPLE = ("Tom", "Ana", "Sam", "Mia", "Leo", "Zoe")
CONTAINERS = (("box", "boxes", "pencils"), ("bag", "bags", "oranges"), ("shelf", "shelves", "books"),
              ("tray", "trays", "cookies"), ("pack", "packs", "cards"), ("jar", "jars", "candies"))


def equation(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return rng.choice(("{a} + {b} =", "{a}+{b}=")).format(a=a, b=b), a + b


def add3(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(100, 999), rng.randint(100, 999)
    return rng.choice(("What is {a} + {b}?", "Calculate {a} + {b}.")).format(a=a, b=b), a + b


def word_add(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    who, what = rng.choice(PEOPLE), rng.choice(OBJECTS)
    story = rng.choice((
        "{who} has {a} {what} and gets {b} more. How many {what} does {who} have now?",
        "There are {a} {what} in a room. Someone brings {b} more {what}. How many {what} are in the room?",
        "{who} collected {a} {what} on Monday and {b} {what} on Tuesday. How many {what} did {who} collect?",
    ))
    return story.format(who=who, what=what, a=a, b=b), a + b


def word_mul(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    one, many, what = rng.choice(CONTAINERS)
    story = rng.choice((
        "A {one} holds {a} {what}. How many {what} are in {b} {many}?",
        "There are {b} {many} with {a} {what} in each. How many {what} are there in all?",
        "Each {one} has {a} {what}. If you have {b} {many}, how many {what} do you have?",
    ))
    return story.format(one=one, many=many, what=what, a=a, b=b), a * b


FAMILIES = {"equations": equation, "add3": add3, "word-add": word_add, "word-mul": word_mul}


def training_questions() -> frozenset[str]:
    """arith-nl's questions (train and test): a probe question is never one of them."""
    return frozenset(json.loads(line)["question"] for name in ("train.jsonl", "test.jsonl")
                     for line in (ARITH_NL / name).read_text().splitlines() if line.strip())


def draw(family: str, rng: random.Random, exclude: frozenset[str]) -> list[dict]:
    rows: list[dict] = []
    seen: set[str] = set()
    while len(rows) < ROWS:
        question, answer = FAMILIES[family](rng)
        if question not in seen and question not in exclude:
            seen.add(question)
            rows.append({"question": question, "answer": answer, "family": family})
    return rows


def main() -> None:
    exclude = training_questions()
    for i, family in enumerate(FAMILIES):
        rows = draw(family, random.Random(20261130 + i), exclude)
        (HERE / f"{family}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
