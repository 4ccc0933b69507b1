"""User reward functions for tests/integration/test_dataset_run.py, imported by path (reward.python_path).

``length_and_suffix``: a reward the test can recompute from the metrics (the completion's length in
thousandths), correct when the completion ends with the answer; it raises for rows marked
``"boom": true`` (the run must count those samples as failed rewards and go on).
"""


def length_and_suffix(completion, answer, prompt, row, **_):
    if row.get("boom"):
        raise ValueError(f"boom on {prompt!r}")
    return {"reward": len(completion) / 1000.0, "correct": completion.endswith(answer), "chars": len(completion)}
