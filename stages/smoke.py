"""The `smoke` stage: compute and collectives together on every node, with a hard timeout.

Passes when every rank of every active node reported, the all-reduce over all ranks
returned exactly the expected sum, and every loss was finite, all before `timeout_s`.
A rank that never reported marks its node as a suspect.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field

from campaign.exits import ExitClass
from campaign.stagebase import Context, StageSpec, Targets, Verdict, after_retry, at_step, last_output_line, where


class SmokeStage(StageSpec):
    """A few steps on every node: every rank reports, the all-reduce is exact, loss is finite."""

    kind: Literal["smoke"] = "smoke"
    """Stage kind."""
    steps: int = Field(default=3, ge=1, le=1000)
    """Training steps to run."""
    timeout_s: float = Field(default=300.0, gt=0)
    """Hard limit on the attempt's wall time; past it the job is killed (exit 124)."""


def first_targets(stage: SmokeStage, spec: Any, nodes: int) -> Targets:
    """What the stage's (first) attempt must do; `--dry-run` shows the same."""
    return Targets(steps=stage.steps, checkpoint_final=False)  # nothing resumes from it


def run(ctx: Context, stage: SmokeStage) -> Verdict:
    """One attempt on the stage's nodes (and the one confirming retry a crash without evidence
    gets, `Context.launch_confirmed`), then the verdict."""
    outcome, first = ctx.launch_confirmed(first_targets(stage, ctx.spec, stage.nodes or ctx.spec.site.nodes),
                                          nodes=stage.nodes, timeout_s=stage.timeout_s)
    return after_retry(judge({**outcome.as_dict(), "progress": ctx.spec.trainer.progress},
                             expected_ranks=outcome.world_size, steps=stage.steps,
                             startup_expected=ctx.spec.trainer.progress == "metrics"), first)


def judge(result: dict[str, Any], *, expected_ranks: int, steps: int, startup_expected: bool = True) -> Verdict:
    """Pure verdict on one attempt's result (`Outcome.as_dict()`). `startup_expected`:
    the trainer writes startup.json (False for `progress: stdout`: every rank exiting 0 with
    finite losses is then the evidence, and the verdict says what was not checked)."""
    numbers: dict[str, Any] = {"expected_ranks": expected_ranks, "exit_code": result.get("exit_code")}
    if expected_ranks == 0:  # nothing was launched (too few usable nodes): say why, not "an all-reduce over 0 ranks"
        run_dir = f" (run directory {result['run_dir']})" if result.get("run_dir") else ""
        return Verdict(False, f"no rank was launched: {result.get('error') or 'no usable node'}{run_dir}", numbers)
    if not startup_expected and not result.get("startup"):
        return _judge_exits(result, numbers, expected_ranks, steps)
    startup = result.get("startup") or {}
    reported = sorted({int(r["rank"]) for r in startup.get("ranks", [])})
    numbers["ranks_reported"] = len(reported)
    missing = sorted(set(range(expected_ranks)) - set(reported))
    if result.get("exit_class") in (ExitClass.STALLED, ExitClass.TIMED_OUT):
        return _stopped(result, numbers)
    if missing:
        return Verdict(False, f"{len(missing)} of {expected_ranks} ranks never reported (ranks {missing[:8]}); "
                       f"suspect nodes: {_names(result)}{where(result, 'startup.json')}"
                       # why, where the trainer said it before its start-up check (exit 93: a refused config)
                       + (last_output_line(result) if result.get("exit_class") != ExitClass.SUCCEEDED else ""),
                       numbers)
    allreduce = startup.get("allreduce") or {}
    got, expected = allreduce.get("got"), allreduce.get("expected")
    numbers.update(allreduce_got=got, allreduce_expected=expected)
    if got is None or got != expected:
        return Verdict(False, f"all-reduce over {expected_ranks} ranks returned {got}, expected exactly {expected}", numbers)
    losses, failed = _steps_verdict(result, numbers, steps)
    if failed is not None:
        return failed
    return Verdict(True, f"{expected_ranks}/{expected_ranks} ranks reported; all-reduce {got:g} == {expected:g}; "
                   f"{steps} steps, loss {losses[-1]:.4f} finite", numbers)


def _steps_verdict(result: dict[str, Any], numbers: dict[str, Any], steps: int) -> tuple[list[Any], Verdict | None]:
    """The losses, and a failing verdict when one is not finite, the trainer did not exit 0,
    or fewer than `steps` steps reported a loss (None when all is well)."""
    losses = [m["loss"] for m in result.get("metrics", [])]
    numbers.update(steps_done=len(losses), last_loss=losses[-1] if losses else None)
    bad = [i + 1 for i, x in enumerate(losses) if x is None or not math.isfinite(x)]
    if bad:
        return losses, Verdict(False, f"non-finite loss at step {bad[0]}", numbers)
    if result.get("exit_code") != 0:
        return losses, Verdict(False, f"trainer exited {result.get('exit_code')} ({result.get('exit_class')}) "
                               f"{at_step(result.get('last_step'))}{_log(result)}", numbers)
    if not losses and result.get("progress") == "stdout":
        return losses, Verdict(False, f"the trainer exited 0 without a line that trainer.step_pattern matches in "
                               f"rank 0's output ({result.get('log')}){last_output_line(result)}", numbers)
    if len(losses) < steps:
        return losses, Verdict(False, f"only {len(losses)} of {steps} steps reported a loss"
                               f"{where(result, 'metrics.jsonl')}", numbers)
    return losses, None


def _judge_exits(result: dict[str, Any], numbers: dict[str, Any], expected_ranks: int, steps: int) -> Verdict:
    """A trainer without startup.json: every rank must exit 0 with finite losses for every step."""
    if result.get("exit_class") in (ExitClass.STALLED, ExitClass.TIMED_OUT):
        return _stopped(result, numbers)
    numbers["not_checked"] = NOT_CHECKED
    if result.get("killed_by") == "exit_hung" and result.get("stall"):  # every rank must exit in a smoke test
        return Verdict(False, f"{result['stall']}; suspect nodes: {_names(result)}{_log(result)}", numbers)
    losses, failed = _steps_verdict(result, numbers, steps)
    if failed is not None:
        return failed
    rows = result.get("metrics") or []
    if rows and rows[0]["step"] == 0:  # detection: it counts from 0, and trained one step more than asked
        return Verdict(False, f"the trainer's first step line says step 0 and it reported {len(rows)} steps for "
                       f"{steps} asked: it counts from 0; set trainer.first_step: 0 (then it gets {{max_steps}} = "
                       f"steps - 1 and its step N is recorded as N + 1){_log(result)}", numbers)
    return Verdict(True, f"{expected_ranks}/{expected_ranks} ranks exited 0; {steps} steps, loss {losses[-1]:.4f} "
                   f"finite; not checked: {NOT_CHECKED}", numbers)


def _stopped(result: dict[str, Any], numbers: dict[str, Any]) -> Verdict:
    """A launch the supervisor stopped: a stall (no progress), or the hard timeout (exit 124)."""
    what = "stalled" if result.get("exit_class") == ExitClass.STALLED else "hit the hard timeout"
    reason = f" [{result['stall']}]" if result.get("stall") else ""
    return Verdict(False, f"{what} after {result.get('duration_s', 0):.0f} s {at_step(result.get('last_step'))}; "
                   f"exit {result.get('exit_code')}{reason}; suspect nodes: {_names(result)}{_log(result)}", numbers)


NOT_CHECKED = ("each rank's start-up and the all-reduce sum (the trainer writes no startup.json; "
               "campaign.report.startup_check writes it)")


def _log(result: dict[str, Any]) -> str:
    return f"; rank 0's log: {result['log']}" if result.get("log") else ""


def _names(result: dict[str, Any]) -> str:
    suspects = result.get("suspects") or []
    return ", ".join(s["node"] for s in suspects) or "none identified"
