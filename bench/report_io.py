"""Where every benchmark leaves its results: ``<name>.json``, ``<name>.md`` and a plot."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def write_results(out: str | Path, name: str, result: dict, markdown: Callable[[dict], str],
                  plot: Callable[[dict, Path], None] | None = None, png: str | None = None) -> str:
    """Write ``result`` as JSON and its markdown table (and ``plot`` to ``png``, by default
    ``<name>.png``) under ``out``; returns the markdown, for the caller to print."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (out / f"{name}.md").write_text(text)
    if plot is not None:
        plot(result, out / (png or f"{name}.png"))
    return text
