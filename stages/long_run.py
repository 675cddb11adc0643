"""The `long_run` stage: train to a token (or step) target with periodic checkpoints.

Each attempt resumes from the newest complete checkpoint of the stage, never from zero,
so tokens and loss continue across attempts. The stage records every attempt it needed.
A failed attempt is relaunched only while the attempt budget lasts and its exit class is
resumable (see `campaign.exits.RESUMABLE`); otherwise the stage fails with the exit code
and the last step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from campaign import exits
from campaign.stagebase import StageSpec, Verdict

if TYPE_CHECKING:
    from campaign.engine import AttemptOutcome, StageContext


class LongRunStage(StageSpec):
    """Train to the target, checkpointing every `checkpoint_every` steps."""

    kind: Literal["long_run"] = "long_run"
    """Stage kind."""
    tokens: int | None = Field(default=None, ge=1)
    """Token target (cumulative over all ranks); give this or `steps`."""
    steps: int | None = Field(default=None, ge=1)
    """Step target; give this or `tokens`."""
    checkpoint_every: int = Field(default=50, ge=1)
    """Steps between checkpoints."""
    max_attempts: int = Field(default=1, ge=1)
    """Attempts (the first launch and relaunches) before the stage gives up."""
    timeout_s: float = Field(default=3600.0, gt=0)
    """Hard limit on one attempt's wall time; past it the job is killed (exit 124)."""

    @model_validator(mode="after")
    def _one_target(self) -> LongRunStage:
        if (self.tokens is None) == (self.steps is None):
            raise ValueError("give exactly one of tokens or steps as the target")
        return self


def run(ctx: StageContext, stage: LongRunStage) -> Verdict:
    steps = stage.steps or ctx.steps_for_tokens(stage.tokens or 0, stage.nodes)
    outcomes: list[AttemptOutcome] = []
    while len(outcomes) < stage.max_attempts:
        outcome = ctx.launch(steps=steps, nodes=stage.nodes, timeout_s=stage.timeout_s, resume=True,
                             max_tokens=stage.tokens, train={"checkpoint_every": stage.checkpoint_every})
        outcomes.append(outcome)
        if outcome.exit_code == 0 or outcome.exit_class not in exits.RESUMABLE:
            break
    return judge([o.as_dict() for o in outcomes], steps=steps, tokens=stage.tokens, max_attempts=stage.max_attempts)


def judge(attempts: list[dict[str, Any]], *, steps: int, tokens: int | None, max_attempts: int) -> Verdict:
    """Pure verdict over the stage's attempts (oldest first)."""
    last = attempts[-1]
    rows = [m for a in attempts for m in a.get("metrics", [])]
    final = rows[-1] if rows else {}
    numbers = {"attempts": len(attempts), "last_step": final.get("step"), "tokens": final.get("tokens"),
               "last_loss": final.get("loss"), "exit_classes": [a.get("exit_class") for a in attempts]}
    if last.get("exit_code") != 0:
        why = f"attempt {len(attempts)} exited {last.get('exit_code')} ({last.get('exit_class')}) at step {last.get('last_step')}"
        if last.get("exit_class") not in exits.RESUMABLE:
            why += "; not resumable"
        elif len(attempts) >= max_attempts:
            why += f"; attempt budget of {max_attempts} spent"
        return Verdict(False, why, numbers)
    reached = (final.get("tokens") or 0) >= tokens if tokens else (final.get("step") or 0) >= steps
    if not reached:
        return Verdict(False, f"trainer stopped at step {final.get('step')} ({final.get('tokens')} tokens) short of the target",
                       numbers)
    loss = final.get("loss")
    if loss is None or not math.isfinite(loss):
        return Verdict(False, f"final loss is not finite ({loss})", numbers)
    target = f"{tokens:,} tokens" if tokens else f"{steps} steps"
    return Verdict(True, f"reached {target} (step {final['step']}, {final['tokens']:,} tokens) in {len(attempts)} "
                   f"attempt(s); final loss {loss:.4f}", numbers)
