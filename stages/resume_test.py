"""The `resume_test` stage: checkpoint, interrupt, resume, and compare with an uninterrupted run.

1. reference: an uninterrupted run from step 1 to `steps`;
2. for each signal (SIGKILL, SIGTERM): a run with the reference's targets (its max_steps
   too) and a checkpoint at `checkpoint_step`, sent the signal once step `interrupt_step` is
   reported (mid-training: the signal ends it, not its step budget), then resumed to `steps`;
   a resumed run that fails without evidence gets one confirming retry from the same
   checkpoint (never one the failed attempt wrote after it);
3. the resumed losses must equal the reference bit for bit (`tolerance: 0`, deterministic
   runs) or within the tolerance; tokens must continue without a gap or repeat. They are
   compared with the interrupted run's own logged steps too, which tells a resume that lost
   state from two runs that were never the same.
The verdict names the first step that differs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from campaign import contract, report
from campaign.stagebase import Context, Outcome, StageSpec, Targets, Verdict, after_retry, where
from campaign.train.config import Fault


class ResumeTestStage(StageSpec):
    """Interrupt a run after a checkpoint, resume it, and compare with an uninterrupted one."""

    kind: Literal["resume_test"] = "resume_test"
    """Stage kind."""
    checkpoint_step: int = Field(default=10, ge=1)
    """Step at which the interrupted run saves its checkpoint."""
    interrupt_step: int = Field(default=12, ge=1)
    """The job is interrupted once this step is reported (after the checkpoint)."""
    steps: int = Field(default=16, ge=2)
    """Last step of both runs."""
    signals: list[Literal["SIGKILL", "SIGTERM"]] = Field(default=["SIGKILL", "SIGTERM"], min_length=1)
    """How to interrupt; each signal is its own interrupted-and-resumed run."""
    tolerance: float = Field(default=0.0, ge=0)
    """Largest allowed |resumed - reference| loss per step (0: bit for bit)."""
    faults: list[Fault] = []
    """Deliberate faults for tests (needs CAMPAIGN_ALLOW_FAULTS=1), e.g. data_off_by_one."""

    @model_validator(mode="after")
    def _order(self) -> ResumeTestStage:
        if not self.checkpoint_step < self.interrupt_step < self.steps:
            raise ValueError(f"need checkpoint_step < interrupt_step < steps, got {self.checkpoint_step}, "
                             f"{self.interrupt_step}, {self.steps}")
        return self

    def injected_faults(self) -> tuple[Fault, ...]:
        return tuple(self.faults)

    def check_in(self, spec: Any) -> None:
        why = resume_test_unsatisfiable(spec.trainer)
        if why:
            raise ValueError(f": the resume test cannot run with this trainer: {why}")

    def attempts_bound(self) -> int:
        return 1 + 2 * len(self.signals)  # the reference run, then per signal the interrupted run and its resume


NO_CKPT = {"checkpoint_every": 0}


def resume_test_unsatisfiable(trainer: Any) -> str | None:
    """Why no run of `trainer` (a TrainConfig) can satisfy the resume test, or None; checked by
    `campaign validate`, before any node is spent."""
    if trainer.command is None or trainer.checkpoints is not None:
        return None
    if trainer.progress == "stdout":
        return ("trainer.progress is stdout and trainer.checkpoints is not set, so campaign finds no checkpoint "
                "to wait for and resume from; set trainer.checkpoints (your trainer's own files: glob, complete) "
                "and trainer.resume_args (how it resumes), or write step-NNNNNNNN/ checkpoints with campaign.report")
    return None


def first_targets(stage: ResumeTestStage, spec: Any, nodes: int) -> Targets:
    """What the uninterrupted reference run must do; `--dry-run` shows the same."""
    return Targets(steps=stage.steps, checkpoints="checkpoints-reference", train=NO_CKPT, checkpoint_final=False,
                   exact=True)


def run(ctx: Context, stage: ResumeTestStage) -> Verdict:
    # Bit-for-bit comparisons need deterministic kernels (`exact`); neither the reference nor
    # the resumed run is resumed from, so neither saves a final checkpoint (first_targets).
    # The reference and the resumed runs get the confirming retry of a crash without evidence
    # (`launch_confirmed`); the interrupted run is killed on purpose, so its exit is no evidence.
    reference, retried = ctx.launch_confirmed(first_targets(stage, ctx.spec, stage.nodes or ctx.spec.site.nodes),
                                              nodes=stage.nodes, timeout_s=stage.timeout_s, label="reference")
    if reference.exit_code != 0:
        return after_retry(Verdict(False, f"the uninterrupted reference run exited {reference.exit_code} "
                                   f"({reference.exit_class})", {"exit_code": reference.exit_code}), retried)
    checks = []
    own = ctx.spec.trainer.checkpoints is not None
    for sig in stage.signals:
        ckpt = f"checkpoints-{sig.lower()}"
        cut, problem = _interrupted(ctx, stage, sig, ckpt)
        if problem is not None:
            return after_retry(problem, retried)
        redone: list[tuple[Outcome, Verdict | None]] = []

        def point_under_test(first: Outcome, sig: str = sig, ckpt: str = ckpt) -> Targets | None:
            """Before the confirming retry of a failed resume: nothing written after the
            checkpoint under test may be loaded (the failed attempt may have saved at its end)."""
            folder = _set_aside_later(ctx, stage, ckpt, first)
            if folder is not None:
                return None
            again = f"{ckpt}-retry"  # the checkpoint under test was overwritten: interrupt a run again
            redone.append(_interrupted(ctx, stage, sig, again))
            return _resume_targets(stage, again)

        resumed, first = ctx.launch_confirmed(_resume_targets(stage, ckpt), nodes=stage.nodes,
                                              timeout_s=stage.timeout_s, label=f"resume after {sig}",
                                              faults=tuple(stage.faults), before_retry=point_under_test)
        retried = first or retried
        if redone:
            cut, problem = redone[-1]
            if problem is not None:
                return after_retry(problem, retried)
        checks.append(compare(sig, reference.metrics, cut.as_dict(), resumed.as_dict(), stage.tolerance,
                              checkpoint_step=stage.checkpoint_step, own_checkpoint=own))
    return after_retry(judge(checks), retried)


def _resume_targets(stage: ResumeTestStage, ckpt: str) -> Targets:
    return Targets(steps=stage.steps, resume=True, checkpoints=ckpt, train=NO_CKPT, checkpoint_final=False, exact=True)


PACE_S = 1.0
"""Seconds the built-in trainer waits at the start of each step after the interrupt step in the
interrupted run: the signal lands mid-training however fast its steps are (a sleep: what the
run computes does not change)."""


def _interrupted(ctx: Context, stage: ResumeTestStage, sig: str, ckpt: str) -> tuple[Outcome, Verdict | None]:
    """The run to interrupt: the same targets as the reference (max_steps too: a trainer whose
    LR schedule follows max_steps, build-nanogpt's cosine, would otherwise train another run)
    plus a checkpoint at `checkpoint_step`; `sig` is sent once `interrupt_step` is reported
    and that checkpoint is complete (an async save may still be writing it). A trainer's own
    checkpoints (trainer.checkpoints) are waited for by step, or, when the name gives none
    (nanoGPT's ckpt.pt, timestamped folders), as one saved during the run. Returns the
    outcome, and the verdict when there is nothing to resume from or nothing was interrupted."""
    own = ctx.spec.trainer.checkpoints is not None
    pace = () if ctx.spec.trainer.command is not None else (
        Fault(kind="slow", step=stage.interrupt_step + 1, delay_s=PACE_S),)
    cut = ctx.launch(Targets(steps=stage.steps, checkpoints=ckpt, checkpoint_at=(stage.checkpoint_step,),
                             train=NO_CKPT, checkpoint_final=False, exact=True),
                     nodes=stage.nodes, timeout_s=stage.timeout_s, label=f"{sig} at step {stage.interrupt_step}",
                     faults=pace,
                     interrupt={"after_step": stage.interrupt_step, "signal": sig,
                                "after_checkpoint": str(ctx.stage_dir / ckpt /
                                                        report.checkpoint_name(stage.checkpoint_step)),
                                "checkpoint_step": stage.checkpoint_step,
                                # the built-in trainer's async saves may lag: it gets the timeout
                                "give_up_step": give_up_step(stage) if own else None})
    stalled = bool(cut.report.stall and cut.report.stall.startswith("no complete checkpoint"))
    if stalled or (cut.exit_code == 0 and _checkpoint_of(ctx, ckpt, stage.checkpoint_step) is None):
        layout = ctx.spec.trainer.checkpoints
        found = (f"trainer.checkpoints.glob {layout.glob!r}" if own and layout else
                 f"{report.checkpoint_name(stage.checkpoint_step)}/{report.COMPLETE_MARKER}")
        return cut, Verdict(False, f"the interrupted run ({sig}) reached step {cut.last_step} without a "
                            f"complete checkpoint of step {stage.checkpoint_step} in "
                            f"{ctx.stage_dir / ckpt} ({found}): the trainer must save at {{checkpoint_at}} "
                            f"(CAMPAIGN_CHECKPOINT_AT); rank 0's log: {cut.rank0_log}",
                            {"cut_last_step": cut.last_step})
    if cut.exit_code == 0 or (cut.last_step or 0) >= stage.steps:
        times = [m["step_time_s"] for m in cut.metrics if m.get("step_time_s")]
        took = f"; its steps took {sorted(times)[len(times) // 2]:.3g} s" if times else ""
        return cut, Verdict(False, f"the interrupted run ({sig}) reached its last step ({stage.steps}, exit "
                            f"{cut.exit_code}) before the signal could land after step {stage.interrupt_step}: nothing "
                            f"was interrupted mid-training{took}, and the supervisor looks every 0.25 s; leave more "
                            "steps between interrupt_step and steps", {"cut_last_step": cut.last_step})
    return cut, None


def _checkpoint_of(ctx: Context, ckpt: str, step: int) -> dict[str, Any] | None:
    """The complete checkpoint of `step` in the stage's folder `ckpt` (a trainer's own whose
    name gives no step: the newest complete one), or None."""
    done = [c for c in contract.list_checkpoints(ctx.spec.trainer.checkpoints, ctx.stage_dir / ckpt) if c["complete"]]
    return next((c for c in done if c["step"] == step), None) or (done[-1] if done and done[-1]["step"] is None
                                                                   else None)


def _set_aside_later(ctx: Context, stage: ResumeTestStage, ckpt: str, first: Outcome) -> Path | None:
    """Move every checkpoint in `ckpt` later than the one under test (the failed resume's own)
    into `ckpt/.set-aside-attempt-N/`, so the confirming retry resumes from the checkpoint of
    `checkpoint_step`, as the failed attempt did; an event names them. Returns the checkpoint
    under test, or None when none is left (a trainer's own single file, overwritten)."""
    folder = ctx.stage_dir / ckpt
    later = [c for c in contract.list_checkpoints(ctx.spec.trainer.checkpoints, folder)
             if c["step"] is not None and c["step"] > stage.checkpoint_step]
    if later:
        aside = folder / f".set-aside-attempt-{first.number}"
        aside.mkdir(exist_ok=True)
        for c in later:
            Path(c["path"]).rename(aside / Path(c["path"]).name)
        ctx.event("checkpoint_set_aside", f"before the confirming retry: set aside {len(later)} checkpoint(s) written "
                  f"after step {stage.checkpoint_step} by attempt {first.number} (step(s) "
                  f"{', '.join(str(c['step']) for c in later)}) in {aside}", attempt_id=first.attempt_id,
                  data={"steps": [c["step"] for c in later], "folder": str(aside)})
    found = _checkpoint_of(ctx, ckpt, stage.checkpoint_step)
    if found is not None and found["step"] == stage.checkpoint_step:
        return Path(found["path"])
    return None


def give_up_step(stage: ResumeTestStage) -> int:
    """The step at which the interrupted run is stopped if its checkpoint never appeared."""
    return stage.interrupt_step + max(stage.steps, 2 * (stage.interrupt_step - stage.checkpoint_step))


def _diff(a: float, b: float) -> float:
    """|a - b|; a non-finite loss never equals anything."""
    return abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.inf


def compare(signal: str, reference: list[dict[str, Any]], cut: dict[str, Any], resumed: dict[str, Any],
            tolerance: float, checkpoint_step: int | None = None, own_checkpoint: bool = False) -> dict[str, Any]:
    """One interrupted-and-resumed run against the reference and against the interrupted run's
    own logged steps after its checkpoint (plain data in, plain data out).
    `checkpoint_step`: the resumed run must start right after it (not from scratch).
    `own_checkpoint`: the trainer's own checkpoint (trainer.checkpoints), whose contents
    campaign cannot see: a difference is explained as far as the losses tell (`why_differs`)."""
    out: dict[str, Any] = {"signal": signal, "cut_exit_code": cut.get("exit_code"), "cut_last_step": cut.get("last_step"),
                           "resume_exit_code": resumed.get("exit_code")}
    rows = resumed.get("metrics", [])
    if resumed.get("exit_code") != 0:
        out["problem"] = (f"the resumed run exited {resumed.get('exit_code')} ({resumed.get('exit_class')})"
                          + (f"; rank 0's log: {resumed['log']}" if resumed.get("log") else ""))
        return out
    if not rows:
        out["problem"] = ("the resumed run reported no step: it found a checkpoint at the target already"
                          + where(resumed, "metrics.jsonl"))
        return out
    ref = {m["step"]: m for m in reference}
    first = rows[0]["step"]
    out["resumed_from_step"] = first - 1
    out["first_differing_step"] = None
    out["max_abs_diff"] = 0.0
    if checkpoint_step is not None and first - 1 != checkpoint_step:
        out["problem"] = (f"the resumed run started at step {first}, not after the checkpoint of step "
                          f"{checkpoint_step}")
        return out
    if first - 1 not in ref and first != 1:
        out["problem"] = f"the resumed run started at step {first}, which the reference never reached"
        return out
    expected_tokens = ref[first]["tokens"] if first in ref else None
    if rows[0]["tokens"] != expected_tokens:
        out["problem"] = (f"tokens do not continue: resumed step {first} reports {rows[0]['tokens']} tokens, "
                          f"the reference {expected_tokens}")
        return out
    out.update(against_cut(rows, cut.get("metrics") or [], first, tolerance))
    for m in rows:
        r = ref.get(m["step"])
        if r is None:
            continue
        diff = _diff(m["loss"], r["loss"])
        out["max_abs_diff"] = max(out["max_abs_diff"], diff)
        if diff > tolerance and out["first_differing_step"] is None:
            out["first_differing_step"] = m["step"]
            out["problem"] = (f"loss differs first at step {m['step']}: resumed {m['loss']!r} vs reference "
                              f"{r['loss']!r} (|diff| {diff:.3g} > {tolerance:g})")
            why = why_differs(m["step"], first, reference, rows, own_checkpoint, cut=cut.get("metrics") or [],
                              tolerance=tolerance)
            if why:
                out["problem"] += f"; {why}"
                out["why"] = why
    return out


def against_cut(rows: list[dict[str, Any]], cut: list[dict[str, Any]], first: int, tolerance: float) -> dict[str, Any]:
    """The resumed steps against the interrupted run's own rows of the same steps (those it
    logged after its checkpoint, before the signal): {} when they share none, else
    cut_steps [first, last], cut_max_abs_diff and cut_first_differing_step (None: equal)."""
    own = {m["step"]: m["loss"] for m in cut if m["step"] >= first}
    shared = [m for m in rows if m["step"] in own]
    if not shared:
        return {}
    diffs = [(m["step"], _diff(m["loss"], own[m["step"]])) for m in shared]
    return {"cut_steps": [shared[0]["step"], shared[-1]["step"]], "cut_max_abs_diff": max(d for _, d in diffs),
            "cut_first_differing_step": next((s for s, d in diffs if d > tolerance), None)}


def _steps(span: list[int]) -> str:
    return f"step {span[0]}" if span[0] == span[1] else f"steps {span[0]}-{span[1]}"


def why_differs(step: int, first: int, reference: list[dict[str, Any]], rows: list[dict[str, Any]],
                own_checkpoint: bool, *, cut: list[dict[str, Any]] | None = None, tolerance: float = 0.0) -> str | None:
    """What the losses tell about a resumed run that differs from the reference at `step`
    (its first step is `first`), or None when they tell nothing. `cut`: the interrupted run's
    own rows: a resumed run that repeats them restored that run exactly, and a difference from
    the reference is then between the two runs, not the resume."""
    ref = {m["step"]: m["loss"] for m in reference}
    cut = cut or []
    vs_cut = against_cut(rows, cut, first, tolerance)
    if vs_cut and vs_cut["cut_first_differing_step"] is None:
        same = "bit for bit" if vs_cut["cut_max_abs_diff"] == 0 else f"within {tolerance:g}"
        said = (f"the resumed {_steps(vs_cut['cut_steps'])} equal the interrupted run's own {same}: the checkpoint "
                "restored that run exactly")
        split = next((m["step"] for m in cut if m["step"] in ref and _diff(m["loss"], ref[m["step"]]) > tolerance), None)
        if split is not None:
            return (f"{said}; the interrupted run itself differs from the reference from step {split}: the two runs "
                    "are not the same run (a schedule or data order that depends on something that differs between "
                    "them, or nondeterministic kernels), the resume is not at fault")
        return (f"{said}; the difference comes after the steps it logged: nondeterministic kernels or data read in "
                "another order after the resume")
    prefix = ""
    if vs_cut:
        at = vs_cut["cut_first_differing_step"]
        got = next(m["loss"] for m in rows if m["step"] == at)
        was = next(m["loss"] for m in cut if m["step"] == at)
        prefix = f"the resumed step {at} differs from the interrupted run's own too ({got!r} vs {was!r}): "
    loss = rows[0]["loss"]
    fresh, expected = ref.get(1), ref.get(first)
    if fresh is not None and expected is not None and math.isfinite(loss) and abs(loss - fresh) < abs(loss - expected):
        return (f"{prefix}its first loss {loss:.4g} is nearer the reference's first step ({fresh:.4g}) than step "
                f"{first} ({expected:.4g}): the model state may not have been restored (did the trainer load the "
                "checkpoint?)")
    if step != first:
        return (f"{prefix}steps {first}-{step - 1} matched: the state was restored; a later difference points at "
                "nondeterministic kernels or data read in another order")
    if own_checkpoint:
        return (f"{prefix}the first resumed step already differs while its loss is near the reference's: the model was "
                "restored but not the batches; the trainer's own checkpoint holds no data position or RNG state "
                "campaign can see (a script that reseeds its RNG at start, e.g. torch.manual_seed, draws other "
                "batches after a resume); compare within a tolerance, or save and restore them")
    return (f"{prefix}the first resumed step already differs: the data position or the RNG state was not restored as "
            "saved (the checkpoint's meta.json data_position, rank-RRRRR.pt RNG states)")


def judge(checks: list[dict[str, Any]]) -> Verdict:
    """Pure verdict over the per-signal comparisons."""
    numbers = {"checks": checks}
    for c in checks:
        if c.get("problem"):
            return Verdict(False, f"after {c['signal']}: {c['problem']}", numbers)
    parts = []
    for c in checks:
        exact = "bit for bit" if c["max_abs_diff"] == 0 else f"max |diff| {c['max_abs_diff']:.3g}"
        part = f"{c['signal']}: resumed from step {c['resumed_from_step']}, equal {exact}"
        if c.get("cut_steps"):
            own = "bit for bit" if c["cut_max_abs_diff"] == 0 else f"max |diff| {c['cut_max_abs_diff']:.3g}"
            part += f" (the interrupted run's own {_steps(c['cut_steps'])}: {own})"
        parts.append(part)
    return Verdict(True, "; ".join(parts), numbers)
