"""Write GSM8K's easiest test items, the grade-school suite of deploy/configs/smollm2-arith.yaml (test.jsonl).

Source: GSM8K (Cobbe et al. 2021, https://github.com/openai/grade-school-math, MIT; see SOURCE.md and
LICENSE beside this file), its test split as ``../shared/data/gsm8k/test.jsonl.gz`` holds it (commit
3101c7d5, byte-identical). Recipe: the items whose reference solution takes the fewest reasoning
steps (two lines before ``#### N``, the minimum in the test split: 326 of 1319 items), in the test
file's order; each row keeps the question, the final answer as an integer (``#### N`` with its
thousands commas removed), the solution's step count and the item's line in the test file.

Rows: ``{"question": ..., "answer": <int>, "steps": 2, "gsm8k_test_line": <1-based>}``. The suite
draws ``eval.suites[].prompts`` of them by ``eval.seed``. A 135M model solves about 1% of GSM8K as a
whole; these are the items it has a chance on. Deterministic: ``python deploy/data/gsm8k-easy/make.py
[--source PATH]`` rewrites test.jsonl byte for byte (the committed file is what runs read: a clone
without ../shared still has the suite).
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parents[2].parent / "shared" / "data" / "gsm8k" / "test.jsonl.gz"
EASIEST_STEPS = 2  # solution lines before "#### N": the fewest any test item has


def steps(solution: str) -> int:
    """Reasoning lines of a reference solution (before its ``#### N`` line)."""
    return solution.split("####")[0].strip().count("\n") + 1


def final_answer(solution: str) -> int:
    return int(solution.split("####")[1].strip().replace(",", ""))


def easiest(lines: list[str]) -> list[dict]:
    rows = []
    for number, line in enumerate(lines, start=1):
        item = json.loads(line)
        if steps(item["answer"]) == EASIEST_STEPS:
            rows.append({"question": item["question"], "answer": final_answer(item["answer"]),
                         "steps": EASIEST_STEPS, "gsm8k_test_line": number})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default=str(SOURCE), help="GSM8K's test.jsonl.gz")
    ns = parser.parse_args(argv)
    with gzip.open(ns.source, "rt", encoding="utf-8") as f:
        lines = [x for x in f.read().splitlines() if x.strip()]
    if min(steps(json.loads(x)["answer"]) for x in lines) != EASIEST_STEPS:
        raise SystemExit(f"{ns.source}: the fewest solution steps is not {EASIEST_STEPS}: not GSM8K's test split?")
    (HERE / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in easiest(lines)))


if __name__ == "__main__":
    main()
