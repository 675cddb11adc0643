"""What every stage kind shares: its spec base class and its verdict.

A stage module in `stages/` defines one pydantic spec class (a subclass of `StageSpec`
with a literal `kind`), a pure `judge(...) -> Verdict`, and `run(ctx, stage) -> Verdict`,
which asks the `StageContext` (campaign.attempt) for attempts and judges their results. Stage
modules import only pydantic and the standard library at import time, so validating a
spec never imports torch or parsl.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class StrictModel(BaseModel):
    """Base of every spec model: unknown keys are errors; docstrings document fields."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


class StageSpec(StrictModel):
    """Fields every stage has."""

    name: str = Field(default="", pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    """Stage name, unique in the campaign (default: the kind)."""
    nodes: int | None = Field(default=None, ge=1)
    """Active nodes for this stage (default: all nodes of the site)."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Hard limit on one attempt's wall time; the job is killed (exit 124) past it."""
    continue_on_failure: bool = False
    """Run the later stages even if this one fails (default: a failure stops the campaign)."""

    @property
    def label(self) -> str:
        return self.name or str(getattr(self, "kind"))


@dataclass(frozen=True)
class Verdict:
    """A stage's outcome: pass or fail, the reason a human needs, and the numbers behind it."""

    passed: bool
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)
