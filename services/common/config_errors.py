"""The errors of config loading: ``ConfigError`` and the one-line-per-problem text of a pydantic
``ValidationError`` (the file, then each field, its rule and the offending value)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the field and the rule."""


GOT_MAX_CHARS = 120  # a longer offending value is cut: the field's name already says where it is


def _format_error(e: Any) -> str:
    """One line per problem: the field, the rule, and the offending value when it is one value. A
    missing field's or a section validator's input is the enclosing mapping (for a top-level one,
    the whole file), which would repeat on every line, so it is left out."""
    loc = ".".join(str(p) for p in e["loc"]) or "<root>"
    msg = e["msg"].removeprefix("Value error, ")
    value = e.get("input")
    if e["type"] == "missing" or isinstance(value, dict):
        return f"  {loc}: {msg}"
    got = repr(value)
    return f"  {loc}: {msg} (got {got if len(got) <= GOT_MAX_CHARS else got[:GOT_MAX_CHARS] + '...'})"


def format_errors(err: ValidationError, source: str) -> str:
    return "\n".join([f"invalid config ({source}):", *(_format_error(e) for e in err.errors())])
