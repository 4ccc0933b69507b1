"""Tool calls in the text a model generates, as OpenAI ``tool_calls`` (pure).

The format is the one Hermes-style chat templates (Qwen2/2.5, SmolLM3, Hermes, many others) teach
their models: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number per turn. A
block whose JSON does not parse, or lacks a string ``name``, is left in the text (the agent sees
what the model wrote; nothing is dropped silently)."""

from __future__ import annotations

import json
import re
from typing import Any

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def parse_tool_calls(text: str, id_prefix: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of a generated turn; content None when the turn is only tool calls."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for match in TOOL_CALL.finditer(text):
        call = _call(match.group(1))
        if call is None:
            continue  # left in the text
        kept.append(text[last:match.start()])
        last = match.end()
        calls.append({"id": f"{id_prefix}{len(calls)}", "type": "function",
                      "function": {"name": call[0], "arguments": call[1]}})
    if not calls:
        return text, []
    kept.append(text[last:])
    content = "".join(kept).strip()
    return content or None, calls


def _call(body: str) -> tuple[str, str] | None:
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str) or not parsed["name"]:
        return None
    args = parsed.get("arguments", parsed.get("parameters", {}))
    return parsed["name"], args if isinstance(args, str) else json.dumps(args)
