"""The `long_run` stage: train to a token (or step) target, surviving faults.

Each attempt resumes from the newest complete checkpoint of the stage, never from zero,
so tokens and loss continue across attempts. When an attempt ends badly the exit class
decides (see `campaign.exits`):

- `stalled`, `crashed_node`: exclude the suspect nodes (with their evidence, for
  `exclusion_hours`; at most one per attempt and `exclusion_budget` per stage, the rest are
  named but need a probe), relaunch on the remaining nodes (spares) from the last checkpoint;
- `crashed_unknown`: a crash without evidence against a node (`campaign.evidence`): one
  confirming relaunch with the ranks moved to other nodes, nobody excluded; if it fails the
  same way, `evidence.confirm` decides: the failure followed the node (exclude it) or the
  rank / moved with the job (systemic: stop);
- `walltime`: the block's deadline; the trainer checkpointed; continue in a new block;
- `block_lost`: the scheduler job ended under the attempt (cancelled, nodes failed): relaunch
  in the new block Parsl starts;
- `crashed_systemic`: no node is blamed and none excluded; one confirming retry after a
  backoff (a file system can come back; a node swap cannot fix it), none when the evidence
  says retrying cannot help (a usage error, a missing module); the verdict quotes the last
  error line and names the rank's log;
- `config_error`, `diverged`, `cancelled`: stop at once;
- any failure after rank 0 reported the target step (a rank that crashed or aborted at exit
  once the training was done): not relaunched, which could only redo steps from an older
  checkpoint; the verdict quotes that attempt's final step and loss and says how it ended.
A crash loop (no new step in `crash_loop` consecutive attempts) stops the stage early with
that verdict instead of burning the allocation. Steps lost to each fault are recorded.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from campaign import contract, evidence, exits, goodput
from campaign.exits import ExitClass, NextAction
from campaign.ledger.models import Campaign
from campaign.stagebase import Context, Outcome, StageSpec, Targets, Verdict, at_step, steps_for_tokens, where
from campaign.train.config import Fault
from campaign.watchdog import WatchdogPolicy


RELAUNCH = frozenset(c for c, a in exits.POLICY.items() if a not in (NextAction.DONE, NextAction.STOP))
"""Exit classes after which the long run launches again (while the budget lasts), by
`exits.POLICY`: the resumable ones, the unconfirmed ones (one confirming relaunch), and
systemic failures (retried with backoff, never blaming a node)."""


class LongRunStage(StageSpec):
    """Train to the target, checkpointing every `checkpoint_every` steps; relaunch on faults."""

    kind: Literal["long_run"] = "long_run"
    """Stage kind."""
    tokens: int | None = Field(default=None, ge=1)
    """Token target (cumulative over all ranks); give this or `steps`."""
    steps: int | None = Field(default=None, ge=1)
    """Step target; give this or `tokens`."""
    checkpoint_every: Annotated[int, Field(ge=1)] | Literal["auto"] = 50
    """Steps between checkpoints, or `auto`: Young/Daly from the ledger (the observed save
    stall and step time, and `mtbf_s` or the site's failure history), recomputed before each
    launch; 50 (`PROVISIONAL_EVERY`) until a save and a step were measured."""
    mtbf_s: float | None = Field(default=None, gt=0)
    """Mean time between faults of this stage's job (all its nodes), for `checkpoint_every:
    auto`; unset: from the site's failure history in the ledger."""
    max_attempts: int = Field(default=3, ge=1)
    """Attempts (the first launch and relaunches) before the stage gives up."""
    crash_loop: int = Field(default=3, ge=2)
    """Stop early after this many consecutive attempts without a new step."""
    backoff_s: float = Field(default=2.0, ge=0)
    """Wait before a relaunch after a systemic failure, doubled each time."""
    exclude_suspects: bool = True
    """Exclude the nodes a stall or a crash names (with evidence) before relaunching."""
    exclusion_budget: int = Field(default=3, ge=0)
    """At most this many nodes excluded in the stage (one per attempt) without a probe."""
    exclude_stragglers: bool = False
    """Also exclude straggler nodes (they are always reported, with their step-time ratio)."""
    exclusion_hours: float | None = Field(default=24.0, gt=0)
    """How long an exclusion lasts (null: until `campaign nodes include`)."""
    timeout_s: float = Field(default=86400.0, gt=0)
    """Hard limit on one attempt's wall time; past it the launch is killed (exit 124)."""
    watchdog: WatchdogPolicy = WatchdogPolicy()
    """Stall budgets: start-up, steady step (k x p99 + floor), checkpoint."""
    faults: list[Fault] = []
    """Deliberate faults for drills (needs CAMPAIGN_ALLOW_FAULTS=1)."""

    @field_validator("checkpoint_every", mode="before")
    @classmethod
    def _steps_or_auto(cls, v: Any) -> Any:
        if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            return v
        raise ValueError(f"must be a number of steps >= 1, or auto; got {v!r}")

    @model_validator(mode="after")
    def _one_target(self) -> LongRunStage:
        if (self.tokens is None) == (self.steps is None):
            raise ValueError("give exactly one of tokens or steps as the target")
        return self

    periodic_checkpoints: ClassVar[bool] = True

    def injected_faults(self) -> tuple[Fault, ...]:
        return tuple(self.faults)

    def token_target(self) -> int | None:
        return self.tokens

    def continues_across_blocks(self) -> bool:
        return True

    def needs_failure_rate(self) -> bool:
        return self.checkpoint_every == "auto" and not self.mtbf_s


def first_targets(stage: LongRunStage, spec: Any, nodes: int) -> Targets:
    """What every attempt of the stage must do (relaunches resume); `--dry-run` shows the same."""
    steps = stage.steps or steps_for_tokens(spec, stage.tokens or 0, stage.nodes)
    every = PROVISIONAL_EVERY if stage.checkpoint_every == "auto" else stage.checkpoint_every
    return Targets(steps=steps, resume=True, max_tokens=stage.tokens, train={"checkpoint_every": every})


def run(ctx: Context, stage: LongRunStage) -> Verdict:
    targets = first_targets(stage, ctx.spec, stage.nodes or ctx.spec.site.nodes)
    steps = targets.steps
    announced: int | None = 0
    ckpt = ctx.stage_dir / targets.checkpoints
    outcomes: list[Outcome] = []
    excluded: list[str] = []
    while True:
        confirming = bool(outcomes) and exits.follows(outcomes[-1].exit_class) is NextAction.CONFIRM
        every = checkpoint_every(ctx, stage)
        before = ctx.attempts_made()  # this stage's attempts so far, earlier drivers' included
        outcome = ctx.launch(replace(targets, train={"checkpoint_every": every}), nodes=stage.nodes,
                             timeout_s=stage.timeout_s, watchdog=stage.watchdog, faults=tuple(stage.faults),
                             label="" if not before else relaunch_label(before + 1, confirming),
                             rotate=1 if confirming else 0)
        if confirming:
            outcome = ctx.confirm(outcomes[-1], outcome)
        if outcomes:
            _check_resumed(ctx, outcomes[-1], outcome, announced)
        outcomes.append(outcome)
        if stage.exclude_stragglers and outcome.report.stragglers:
            excluded += ctx.exclude_stragglers(outcome, hours=stage.exclusion_hours)
        stop = next_action(outcomes, stage, target_step=steps)
        if stop is not None:
            break
        excluded_now: list[str] = []
        if (outcome.suspects and stage.exclude_suspects
                and exits.follows(outcome.exit_class) is NextAction.EXCLUDE_AND_RESUME):
            budget = evidence.exclusion_budget(outcome.suspects, already_excluded=len(excluded),
                                               per_chain=stage.exclusion_budget)
            excluded_now = ctx.exclude_suspects(outcome, hours=stage.exclusion_hours,
                                                only=[s.node for s in budget.exclude])
            excluded += excluded_now
            if budget.probe:
                ctx.event("exclusion_budget", f"not excluded without a probe: {budget.reason}",
                          attempt_id=outcome.attempt_id, data={"probe": [s.node for s in budget.probe]})
        newest = contract.newest_complete(ctx.spec.trainer.checkpoints, ckpt)
        announced = newest["step"] if newest else 0
        rescue = outcome.report.rescue or {}
        rescued = bool(rescue.get("saved")) and newest is not None and newest.get("step") == rescue.get("step")
        cause = relaunch_cause(outcome.exit_class)
        drill = ctx.drill_of(outcome)
        # What a person needs first (which relaunch, why, from where, what was lost), then the detail.
        ctx.event("relaunch", f"relaunch {outcome.number} (attempt {outcome.number + 1}) after {cause}"
                  f"{' (a drill)' if drill else ''}: " + relaunch_from(newest, outcome.last_step, rescued=rescued)
                  + f" [{outcome.exit_class}, exit {outcome.exit_code}"
                  f"{'; ' + outcome.report.stall if outcome.report.stall else ''}]",
                  attempt_id=outcome.attempt_id,
                  data={"resume_step": announced, "steps_lost": max((outcome.last_step or 0) - (announced or 0), 0)
                        if announced is not None else None, "exit_class": outcome.exit_class, "cause": cause,
                        "relaunch": outcome.number, "attempt": outcome.number + 1, "rescued": rescued,
                        "last_step": outcome.last_step, "drill": drill, "excluded": excluded_now})
        if exits.follows(outcome.exit_class) is NextAction.RETRY_AFTER_BACKOFF and stage.backoff_s:
            systemic = sum(1 for o in outcomes if o.exit_class == outcome.exit_class)
            time.sleep(stage.backoff_s * 2 ** (systemic - 1))
    return judge([o.as_dict() for o in outcomes], steps=steps, tokens=stage.tokens, stop=stop,
                 max_attempts=stage.max_attempts, crash_loop=stage.crash_loop, carried=ctx.stage_progress(),
                 excluded=excluded)


PROVISIONAL_EVERY = 50
"""`checkpoint_every: auto` before the ledger knows a save's cost and the step time."""


def checkpoint_every(ctx: Context, stage: LongRunStage) -> int:
    """The stage's interval in steps; for `auto`, Young/Daly from the ledger (an event says which)."""
    if stage.checkpoint_every != "auto":
        return stage.checkpoint_every
    with ctx.ledger.session() as s:
        c = s.get(Campaign, ctx.run.campaign_id)
        assert c is not None
        nodes = stage.nodes or ctx.spec.site.nodes
        rescue = contract.rescue_covers(ctx.spec.trainer, ctx.spec.site, nodes)
        sug = goodput.suggest_interval(s, c, nodes=nodes, rescue=rescue, mtbf_s=stage.mtbf_s)
    if sug is None:
        ctx.event("checkpoint_interval", f"checkpoint_every auto: {PROVISIONAL_EVERY} steps until a save and "
                  "a step are measured")
        return PROVISIONAL_EVERY
    rescued = (f", {goodput.rescued_words(*sug.rescued)}: {sug.unrescued_mtbf_s:.0f} s without a rescue"
               if sug.rescue else "")
    ctx.event("checkpoint_interval", f"checkpoint_every auto: {sug.steps} steps (Young/Daly: save {sug.save_s:.2f} s, "
              f"MTBF {sug.mtbf_s:.0f} s from {sug.source}{rescued}, step {sug.step_s:.3f} s)", data=sug.as_dict())
    return sug.steps


def next_action(outcomes: list[Outcome], stage: LongRunStage, *, target_step: int | None = None) -> str | None:
    """None to relaunch, else why the stage stops now. An attempt that failed after its rank 0
    reported the target step (`target_step`: a rank crashed, or aborted at exit, once the
    training was done) is not relaunched: every step is trained, a relaunch could only redo
    steps from an older checkpoint ("target reached")."""
    last = outcomes[-1]
    if last.exit_code == 0:
        return "done"
    if target_step is not None and (last.last_step or 0) >= target_step and last.exit_class != ExitClass.DIVERGED:
        return "target reached"
    if last.exit_class not in RELAUNCH:
        return "not resumable"
    finding, action = last.report.finding or {}, exits.follows(last.exit_class)
    if action is NextAction.RETRY_AFTER_BACKOFF and (finding.get("retry") == evidence.Retry.STOP or
                                                     sum(o.exit_class == last.exit_class for o in outcomes) > 1):
        return "systemic"
    if finding.get("retry") == evidence.Retry.STOP and action is NextAction.CONFIRM:
        return "systemic"
    if len(outcomes) >= stage.max_attempts:
        return "budget"
    if _no_progress(outcomes, stage.crash_loop):
        return "crash loop"
    return None


def _no_progress(outcomes: list[Any], k: int) -> bool:
    """The last `k` attempts reported no step beyond what came before them."""
    if len(outcomes) < k:
        return False
    before = max((o.last_step or 0) for o in outcomes[:-k]) if len(outcomes) > k else 0
    return all((o.last_step or 0) <= before for o in outcomes[-k:])


CAUSES = {ExitClass.STALLED: "hang", ExitClass.TIMED_OUT: "timeout", ExitClass.CRASHED_NODE: "crash",
          ExitClass.CRASHED_UNKNOWN: "crash", ExitClass.CRASHED_SYSTEMIC: "crash", ExitClass.BLOCK_LOST: "node lost",
          ExitClass.WALLTIME: "walltime", ExitClass.ORPHANED: "driver lost"}
"""What a relaunch followed, in a word (status, events, the campaign's plot): by exit class."""


def relaunch_cause(exit_class: str | None) -> str:
    return CAUSES.get(exit_class or "", exit_class or "fault")


def relaunch_label(number: int, confirming: bool = False) -> str:
    """The label of attempt `number` of a long run after a fault: `relaunch K` is attempt
    K + 1, everywhere (status, events, plots, export)."""
    return f"relaunch {number - 1}" + (", confirming retry" if confirming else "")


def relaunch_from(newest: dict[str, Any] | None, last_step: int | None, *, rescued: bool = False) -> str:
    """`from the checkpoint of step 200; 113 step(s) lost`, or what is known when the
    checkpoint's step is not (a file named without one, saved before any step was read)."""
    if newest is None:
        return f"from scratch (no complete checkpoint); {last_step or 0} step(s) lost"
    if newest["step"] is None:
        return f"from {newest['path']} (its step is known once the trainer reports)"
    what = "the rescue checkpoint" if rescued else "the checkpoint"
    return f"from {what} of step {newest['step']}; {max((last_step or 0) - newest['step'], 0)} step(s) lost"


def _check_resumed(ctx: Context, before: Outcome, after: Outcome, announced: int | None) -> None:
    """The relaunch's first step says which checkpoint the trainer really resumed from (its own
    may not be the newest campaign saw, or its step was unknown): an event with the real loss."""
    if not after.metrics:
        return
    resumed = int(after.metrics[0]["step"]) - 1
    if resumed == announced:
        return
    lost = max((before.last_step or 0) - resumed, 0)
    was = f"the checkpoint of step {announced}" if announced is not None else "a checkpoint of unknown step"
    ctx.event("resumed", f"attempt {after.number} resumed from step {resumed} (its first step is {resumed + 1}), not "
              f"{was}: {lost} step(s) lost since attempt {before.number}'s step {before.last_step or 0}",
              attempt_id=after.attempt_id, data={"resume_step": resumed, "steps_lost": lost})


def judge(attempts: list[dict[str, Any]], *, steps: int, tokens: int | None, stop: str = "done",
          max_attempts: int = 1, crash_loop: int = 3, carried: dict[str, Any] | None = None,
          excluded: list[str] | None = None) -> Verdict:
    """Pure verdict over the stage's attempts (oldest first); `stop` is why they ended
    (`next_action`: done, not resumable, budget, crash loop). `carried`: the stage's step,
    tokens and loss in the ledger, which includes what earlier drivers' attempts trained (an
    attempt resumed at its target trains no step of its own). `excluded`: the nodes the stage
    really excluded (suspects are only named as such when nothing was excluded)."""
    last = attempts[-1]
    final: dict[str, Any] = {}
    for m in (m for a in attempts for m in a.get("metrics", [])):
        if m["step"] >= (final.get("step") or 0):  # a step trained again: the later attempt's row
            final = m
    if carried and carried.get("step") and carried["step"] > (final.get("step") or 0):
        final = carried
    classes = [a.get("exit_class") for a in attempts]
    numbers = {"attempts": len(attempts), "last_step": final.get("step"), "tokens": final.get("tokens"),
               "last_loss": final.get("loss"), "exit_classes": classes,
               "suspects": [s["node"] for a in attempts for s in a.get("suspects") or []]}
    if last.get("exit_code") != 0 and stop != "target reached":
        why = (f"attempt {len(attempts)} ended {last.get('exit_class')} (exit {last.get('exit_code')}) "
               f"{at_step(last.get('last_step'))}")
        if last.get("stall"):
            why += f" [{last['stall']}]"
        if last.get("error"):
            why += f": {last['error']}"
        if stop == "not resumable":
            why += "; not retried"
        elif stop == "systemic":
            why += "; systemic: retrying cannot help (no node blamed, none excluded)"
        elif stop == "budget":
            why += f"; attempt budget of {max_attempts} spent ({', '.join(str(c) for c in classes)})"
        elif stop == "crash loop":
            why += f"; crash loop: {crash_loop} attempts in a row made no progress"
        if last.get("exit_class") == ExitClass.CRASHED_SYSTEMIC and stop != "systemic":
            why += "; systemic (no node blamed, none excluded)"
        return Verdict(False, why, numbers)
    reached = (final.get("tokens") or 0) >= tokens if tokens else (final.get("step") or 0) >= steps
    if not reached:
        return Verdict(False, f"trainer stopped at step {final.get('step')} ({final.get('tokens')} tokens) short of the "
                       f"target{where(last, 'metrics.jsonl')}", numbers)
    loss = final.get("loss")
    if loss is None or not math.isfinite(loss):
        return Verdict(False, f"final loss is not finite ({loss})", numbers)
    target = f"{tokens:,} tokens" if tokens else f"{steps} steps"
    faults = ""
    if len(attempts) > 1:
        faults = f" after {len(attempts) - 1} relaunch(es) ({', '.join(str(c) for c in classes[:-1])})"
        if excluded:
            faults += f", excluded {', '.join(excluded)}"
        elif numbers["suspects"]:
            faults += f", suspected {', '.join(numbers['suspects'])} (none excluded)"
    late = f"; {last['stall']}" if last.get("killed_by") == "exit_hung" and last.get("stall") else ""
    if stop == "target reached":
        # the finding's first sentence (what failed, the line quoted); not what it promised next (a retry)
        what = str(last.get("error") or "").split(". ")[0]
        late += (f"; attempt {len(attempts)} then ended {last.get('exit_class')} (exit {last.get('exit_code')}) after its "
                 f"rank 0 reported the last step{': ' + what if what else ''}; not relaunched (no step left to train)")
    return Verdict(True, f"reached {target} (step {final['step']}, {final['tokens']:,} tokens){faults}; "
                   f"final loss {loss:.4f}{late}", numbers)
