"""The `loss_check` stage: N steps, then the loss at the check point against a reference.

The check point is the mean loss over the last `window` steps (default: steps 46-50 of 50);
it passes when it lies within ±`tolerance` of the reference's mean over the same steps.
Missing reference steps are an error, never a silent pass.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Literal

from pydantic import Field, model_validator

from campaign.reference import Reference
from campaign.stagebase import Context, StageSpec, Targets, Verdict, after_retry, at_step, where


EPS = 1e-9
"""Float slack on the tolerance, so a difference of exactly ±tolerance passes."""


class LossCheckStage(StageSpec):
    """N steps; the mean loss of the last `window` steps must match the reference within ±tolerance."""

    kind: Literal["loss_check"] = "loss_check"
    """Stage kind."""
    steps: int = Field(default=50, ge=1)
    """Training steps to run."""
    window: int = Field(default=5, ge=1)
    """The check point is the mean loss of the last this-many steps."""
    tolerance: float = Field(default=0.10, ge=0)
    """Largest allowed |loss - reference| at the check point."""
    reference: Reference = Reference(record=True)
    """The reference: {stage_run: CAMPAIGN/STAGE}, {file: steps.csv} or {record: true}."""

    @model_validator(mode="after")
    def _window_fits(self) -> LossCheckStage:
        if self.window > self.steps:
            raise ValueError(f"window ({self.window}) cannot exceed steps ({self.steps})")
        return self

    def check_steps(self) -> list[int]:
        """The steps whose mean loss is the check point: the last `window` steps."""
        return list(range(self.steps - self.window + 1, self.steps + 1))

    def reference_check_steps(self) -> list[int] | None:
        return self.check_steps()


def first_targets(stage: LossCheckStage, spec: Any, nodes: int) -> Targets:
    """What the stage's first attempt must do (a fresh run in checkpoints-1/); `--dry-run` shows the same."""
    return Targets(steps=stage.steps, checkpoints="checkpoints-1", checkpoint_final=False)


def run(ctx: Context, stage: LossCheckStage) -> Verdict:
    targets = replace(first_targets(stage, ctx.spec, stage.nodes or ctx.spec.site.nodes),
                      checkpoints=f"checkpoints-{ctx.run.attempts_count + 1}")  # a rerun starts afresh
    retry = replace(targets, checkpoints=f"checkpoints-{ctx.run.attempts_count + 2}")
    outcome, first = ctx.launch_confirmed(targets, retry_targets=retry, nodes=stage.nodes, timeout_s=stage.timeout_s)
    check_steps = stage.check_steps()
    if outcome.exit_code != 0:
        stall = f" [{outcome.report.stall}]" if outcome.report.stall else ""
        return after_retry(Verdict(False, f"trainer exited {outcome.exit_code} ({outcome.exit_class}) "
                                   f"{at_step(outcome.last_step)}{stall}; rank 0's log: {outcome.rank0_log}",
                                   {"exit_code": outcome.exit_code}), first)
    reference = None if stage.reference.record else ctx.reference_losses(stage.reference)
    return after_retry(judge(outcome.losses, reference, check_steps, stage.tolerance,
                             hint=where(outcome.as_dict(), "metrics.jsonl")), first)


def judge(losses: dict[int, float], reference: dict[int, float] | None, check_steps: list[int],
          tolerance: float, hint: str = "") -> Verdict:
    """Pure verdict. `reference=None` means this run records the reference. `hint`: where to
    look when steps are missing (`stagebase.where`)."""
    span = f"steps {check_steps[0]}-{check_steps[-1]}" if len(check_steps) > 1 else f"step {check_steps[0]}"
    missing = [s for s in check_steps if s not in losses]
    if missing:
        return Verdict(False, f"the run reported no loss for {_steps(missing)}{hint}", {"missing_steps": missing})
    value = sum(losses[s] for s in check_steps) / len(check_steps)
    numbers: dict[str, object] = {"loss": value, "check_steps": [check_steps[0], check_steps[-1]], "tolerance": tolerance}
    if not math.isfinite(value):
        return Verdict(False, f"loss over {span} is not finite ({value})", numbers)
    if reference is None:
        return Verdict(True, f"recorded as reference: mean loss {value:.4f} over {span}", numbers)
    ref_missing = [s for s in check_steps if s not in reference]
    if ref_missing:
        have = f"{min(reference)}-{max(reference)}" if reference else "none"
        return Verdict(False, f"the reference has no loss for {_steps(ref_missing)} (it has steps {have}); "
                       "record a reference that covers the check point", {**numbers, "reference_missing": ref_missing})
    ref = sum(reference[s] for s in check_steps) / len(check_steps)
    diff = value - ref
    numbers.update(reference=ref, difference=diff)
    ok = abs(diff) <= tolerance + EPS
    word = "within" if ok else "outside"
    return Verdict(ok, f"mean loss over {span} {value:.4f} vs reference {ref:.4f}: difference {diff:+.4f}, "
                   f"{word} ±{tolerance:g}", numbers)


def _steps(steps: list[int]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
