"""The count-down problem distribution (``services.tasks.arith``), shared by the single-turn task
(``task``) and the agentic calculator environment (``agentic.calculator``)."""

from __future__ import annotations

from pydantic import Field, model_validator

from services.common.strict import StrictModel


class CountdownDistribution(StrictModel):
    """How count-down problems are drawn: steps from a truncated power law, step size, start value."""

    min_steps: int = Field(1, ge=1, le=200, description="Fewest subtractions (scratchpad steps) a problem needs.")
    max_steps: int = Field(40, ge=1, le=200, description="Most subtractions (scratchpad steps) a problem needs.")
    alpha: float = Field(1.4, gt=0.0, le=10.0, description="Power-law tail: P(steps=q) ∝ q^-alpha.")
    max_step: int = Field(9, ge=2, le=9, description="The subtracted value d is drawn from 2..max_step.")
    max_value: int = Field(999, ge=102, le=10**9, description="Largest start value n.")

    @model_validator(mode="after")
    def _consistent(self) -> CountdownDistribution:
        if self.min_steps > self.max_steps:
            raise ValueError(f"min_steps ({self.min_steps}) must be <= max_steps ({self.max_steps})")
        if self.max_value < self.max_steps * self.max_step + 100:
            raise ValueError(
                f"max_value ({self.max_value}) must be >= max_steps * max_step + 100 "
                f"({self.max_steps * self.max_step + 100})"
            )
        return self

    def distribution(self) -> dict[str, int | float]:
        """The keyword arguments of ``arith``'s samplers."""
        return {
            "min_steps": self.min_steps,
            "max_steps": self.max_steps,
            "alpha": self.alpha,
            "max_step": self.max_step,
            "max_value": self.max_value,
        }
