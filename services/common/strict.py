"""The base of every config model (unknown keys are errors, assignments are validated) and the
tri-state ``auto``/``on``/``off`` field type.

YAML 1.1 (PyYAML, so config files, ``--set`` values and deployment overrides alike) reads an
unquoted ``on``/``off`` (and ``yes``/``no``/``true``/``false``) as a boolean; ``AutoOnOff``
takes ``True`` as ``"on"`` and ``False`` as ``"off"``, so ``router: off`` means what it says.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def on_off_from_bool(value: Any) -> Any:
    """``True`` -> ``"on"``, ``False`` -> ``"off"`` (what YAML made of an unquoted on/off); anything else unchanged."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


AutoOnOff = Annotated[Literal["auto", "on", "off"], BeforeValidator(on_off_from_bool)]
