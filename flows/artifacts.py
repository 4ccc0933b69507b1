"""Run reports as Prefect artifacts: what people read in the UI.

- ``metrics_table``: one row per iteration with the columns people compare (a table artifact).
- ``embed_images``: the run report's markdown with every local PNG inlined as a
  ``data:image/png;base64`` URI. The Prefect UI renders markdown artifacts itself and serves
  no files of ours; its markdown renderer (3.8, both UIs) keeps ``data:image/...`` sources on
  ``<img>``, so the plots show inside the artifact with nothing else to host.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

# (column, metrics.jsonl key, decimals): the per-iteration table artifact
TABLE_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("iteration", "iteration", 0),
    ("weight version", "weight_version", 0),
    ("reward", "reward_mean", 3),
    ("accuracy", "accuracy", 3),
    ("output length (mean)", "response_len_mean", 1),
    ("generation s", "gen_time_s", 2),
    ("training s", "train_time_s", 2),
    ("idle generation s", "idle_gen_s", 2),
    ("idle training s", "idle_train_s", 2),
    ("samples/s", "samples_per_s", 1),
    ("staleness mean", "staleness_mean", 2),
    ("staleness max", "staleness_max", 0),
    ("push stall ms", "push_stall_s", 1),
)
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+\.png)\)")


def read_metrics(path: Path) -> list[dict]:
    """The complete rows of ``metrics.jsonl``: a last line without its newline is still being
    written by the trainer (a long row reaches the file in more than one write) and is skipped."""
    text = path.read_text() if path.exists() else ""
    complete = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def metrics_table(rows: list[dict]) -> list[dict]:
    """Per-iteration rows for a table artifact (1-based iterations, rounded, ms for the stall)."""
    table = []
    for row in rows:
        out = {}
        for column, key, decimals in TABLE_COLUMNS:
            value = row.get(key)
            if value is None:
                continue
            if key == "iteration":
                value += 1
            elif key == "push_stall_s":
                value *= 1000.0
            out[column] = round(float(value), decimals) if decimals else int(value)
        table.append(out)
    return table


def embed_images(markdown: str, base: Path) -> str:
    """Replace ``![alt](name.png)`` links to files under ``base`` by data URIs; links to
    missing files are left as they are."""

    def inline(match: re.Match) -> str:
        path = base / match.group(2)
        if not path.is_file():
            return match.group(0)
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f"![{match.group(1)}](data:image/png;base64,{data})"

    return _IMAGE.sub(inline, markdown)
