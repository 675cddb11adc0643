"""The `smoke` stage: compute and collectives together on every node, with a hard timeout.

Passes when every rank of every active node reported, the all-reduce over all ranks
returned exactly the expected sum, and every loss was finite, all before `timeout_s`.
A rank that never reported marks its node as a suspect.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from campaign.stagebase import StageSpec, Verdict

if TYPE_CHECKING:
    from campaign.attempt import StageContext


class SmokeStage(StageSpec):
    """A few steps on every node: every rank reports, the all-reduce is exact, loss is finite."""

    kind: Literal["smoke"] = "smoke"
    """Stage kind."""
    steps: int = Field(default=3, ge=1, le=1000)
    """Training steps to run."""
    timeout_s: float = Field(default=300.0, gt=0)
    """Hard limit on the attempt's wall time; past it the job is killed (exit 124)."""


def run(ctx: StageContext, stage: SmokeStage) -> Verdict:
    """One attempt on the stage's nodes, then the verdict."""
    outcome = ctx.launch(steps=stage.steps, nodes=stage.nodes, timeout_s=stage.timeout_s, resume=False)
    return judge(outcome.as_dict(), expected_ranks=outcome.world_size, steps=stage.steps)


def judge(result: dict[str, Any], *, expected_ranks: int, steps: int) -> Verdict:
    """Pure verdict on one attempt's result (`AttemptOutcome.as_dict()`)."""
    numbers: dict[str, Any] = {"expected_ranks": expected_ranks, "exit_code": result.get("exit_code")}
    startup = result.get("startup") or {}
    reported = sorted({int(r["rank"]) for r in startup.get("ranks", [])})
    numbers["ranks_reported"] = len(reported)
    missing = sorted(set(range(expected_ranks)) - set(reported))
    if result.get("exit_class") == "stalled":
        return Verdict(False, f"timed out after {result.get('duration_s', 0):.0f} s at step {result.get('last_step')}; "
                       f"suspect nodes: {_names(result)}", numbers)
    if missing:
        return Verdict(False, f"{len(missing)} of {expected_ranks} ranks never reported (ranks {missing[:8]}); "
                       f"suspect nodes: {_names(result)}", numbers)
    allreduce = startup.get("allreduce") or {}
    got, expected = allreduce.get("got"), allreduce.get("expected")
    numbers.update(allreduce_got=got, allreduce_expected=expected)
    if got is None or got != expected:
        return Verdict(False, f"all-reduce over {expected_ranks} ranks returned {got}, expected exactly {expected}", numbers)
    losses = [m["loss"] for m in result.get("metrics", [])]
    numbers.update(steps_done=len(losses), last_loss=losses[-1] if losses else None)
    bad = [i + 1 for i, x in enumerate(losses) if x is None or not math.isfinite(x)]
    if bad:
        return Verdict(False, f"non-finite loss at step {bad[0]}", numbers)
    if result.get("exit_code") != 0:
        return Verdict(False, f"trainer exited {result.get('exit_code')} ({result.get('exit_class')}) at step "
                       f"{result.get('last_step')}", numbers)
    if len(losses) < steps:
        return Verdict(False, f"only {len(losses)} of {steps} steps reported a loss", numbers)
    return Verdict(True, f"{expected_ranks}/{expected_ranks} ranks reported; all-reduce {got:g} == {expected:g}; "
                   f"{steps} steps, loss {losses[-1]:.4f} finite", numbers)


def _names(result: dict[str, Any]) -> str:
    suspects = result.get("suspects") or []
    return ", ".join(s["node"] for s in suspects) or "none identified"
