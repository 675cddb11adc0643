"""What every stage kind shares: its spec base class and its verdict.

A stage module in `stages/` defines one pydantic spec class (a subclass of `StageSpec`
with a literal `kind`), `first_targets(stage, spec, nodes) -> Targets` (what its first
attempt must do; the dry run calls it too), a pure `judge(...) -> Verdict`, and `run(ctx, stage) -> Verdict`,
which asks the `StageContext` (campaign.stagecontext) for attempts and judges their results. Stage
modules import only pydantic and the standard library at import time, so validating a
spec never imports torch or parsl.

What the rest of the project asks of a stage (the spec's checks, the dry run, the walltime
check, the custom-trainer warnings, the checkpoint interval) are `StageSpec` methods with a
default here, overridden by the kinds that differ: adding a kind touches its own module only
(tests/unit/test_stage_contract.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from campaign import names


class StrictModel(BaseModel):
    """Base of every spec model: unknown keys are errors; docstrings document fields."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


class StageSpec(StrictModel):
    """Fields every stage has."""

    periodic_checkpoints: ClassVar[bool] = False
    """The kind trains to a target with periodic checkpoints (a long run): `campaign status`
    shows the checkpoint interval Young/Daly suggests for its stage runs."""
    name: str = Field(default="", pattern=f"^$|{names.PATTERN}")
    """Stage name, unique in the campaign (default: the kind)."""
    nodes: int | None = Field(default=None, ge=1)
    """Active nodes for this stage (default: all nodes of the site)."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Hard limit on one attempt's wall time; the launch is killed (exit 124) past it."""
    continue_on_failure: bool = False
    """Run the later stages even if this one fails (default: a failure stops the campaign)."""

    @property
    def resolved_name(self) -> str:
        """The stage's name in the ledger, status and run directories: `name`, else its kind.
        (An attempt's `label` is another thing: what that launch was, e.g. "2 node(s)".)"""
        return self.name or str(getattr(self, "kind"))

    def attempt_nodes(self, site_nodes: int) -> list[int]:
        """The node count of each attempt its first pass makes (one per count of a scaling run)."""
        return [self.nodes or site_nodes]

    def attempts_bound(self) -> int:
        """How many attempts the stage makes when nothing fails (the walltime check's `timeout_s x N`)."""
        return 1

    def injected_faults(self) -> tuple[Any, ...]:
        """The deliberate faults (`campaign.train.config.Fault`) its attempts inject."""
        return ()

    def reference_check_steps(self) -> list[int] | None:
        """The steps whose reference losses the stage compares (`campaign.preflight` checks a
        ledger reference has them); None: the stage compares no reference."""
        return None

    def token_target(self) -> int | None:
        """A token target the stage trains to (None: a step count)."""
        return None

    def continues_across_blocks(self) -> bool:
        """Whether the stage checkpoints at a block's end and goes on in the next one (a long
        run), rather than having each attempt fit one block."""
        return False

    def needs_failure_rate(self) -> bool:
        """Whether the spec must give, or the ledger hold, a failure rate for this stage
        (`checkpoint_every: auto` without `mtbf_s`)."""
        return False

    def trainer_warnings(self, trainer: Any) -> list[str]:
        """What this stage asks that `trainer` (a TrainConfig running a command of your own)
        will not do, as "field: message" lines for `campaign validate` and `submit`."""
        return []

    def check_in(self, spec: Any) -> None:
        """What the whole spec must allow of this stage beyond its own fields (the site's nodes,
        the trainer's batch): raises ValueError("field: message"), or ValueError(": message")
        when the stage as a whole cannot run."""


@dataclass(frozen=True)
class Targets:
    """What one attempt must do, as its stage asks (the trainer's `run` section, its
    environment and its argument placeholders are made from these: `attempt.trainer_config`)."""

    steps: int
    """Stop after this step."""
    resume: bool = False
    """Continue from the newest complete checkpoint, if any."""
    checkpoints: str = "checkpoints"
    """The checkpoint folder, under the stage's directory."""
    max_tokens: int | None = None
    """Stop once this many tokens were trained (cumulative, all ranks)."""
    checkpoint_at: tuple[int, ...] = ()
    """Extra steps at which to save a checkpoint."""
    train: dict[str, Any] = field(default_factory=dict)
    """Overrides of the spec's trainer section for this attempt (e.g. checkpoint_every)."""
    checkpoint_final: bool = True
    """Save after the last step; false when nothing resumes from this attempt's end."""
    exact: bool = False
    """The stage compares losses bit for bit: `deterministic: auto` means true."""


def steps_for_tokens(spec: Any, tokens: int, nodes: int | None) -> int:
    """Steps that train at least `tokens` tokens at `nodes` nodes (the spec's model and batch)."""
    from campaign.train.shapes import shape_for

    t = spec.trainer
    ranks = (nodes or spec.site.nodes) * spec.site.ranks_per_node
    per_step = shape_for(spec.model).seq_len * t.micro_batch_size * t.grad_accum * ranks
    return -(-tokens // per_step)


def at_step(step: int | None) -> str:
    """`at step 12`, or `before its first step` (never "step None")."""
    return "before its first step" if step is None else f"at step {step}"


def where(result: dict[str, Any], file: str) -> str:
    """Where to look when `file` of an attempt's run directory lacks what a verdict needed:
    ' (RUN_DIR/metrics.jsonl is missing; rank 0's log: RUN_DIR/logs/rank-0.log)'. Empty for a
    result without a run directory (hand-made results in tests)."""
    run_dir = result.get("run_dir")
    if not run_dir:
        return ""
    state = "has none" if (result.get("files") or {}).get(file) else "is missing"
    return f" ({run_dir}/{file} {state}; rank 0's log: {result.get('log')})"


def last_output_line(result: dict[str, Any]) -> str:
    """`; its last line: '...'` from rank 0's log of an attempt's result (warnings skipped),
    or empty: what a trainer said when it reported no step (e.g. "Unable to locate sufficient
    2 gpus to run this example. Exiting.")."""
    from campaign.evidence import without_warnings

    try:
        with open(str(result.get("log")), "rb") as f:
            f.seek(0, 2)
            f.seek(max(f.tell() - 8192, 0))
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except (OSError, TypeError):
        return ""
    kept = [ln.strip() for ln in without_warnings(lines) if ln.strip()]
    return f"; its last line: {kept[-1]!r}" if kept else ""


def after_retry(verdict: Verdict, first: Any) -> Verdict:
    """`verdict`, saying that it was reached on the confirming retry after `first` (an
    `AttemptOutcome` that ended in a class the evidence could not pin on a node), with that
    attempt's last error line and log; `verdict` unchanged when no retry was made."""
    if first is None:
        return verdict
    finding = first.report.finding or {}
    line = finding.get("last_error_line")
    note = (f" (on a confirming retry: attempt {first.number} ended {first.exit_class}, exit {first.exit_code}"
            f"{': ' + repr(line) if line else ''}; log: {finding.get('log_path') or first.rank0_log})")
    return Verdict(verdict.passed, verdict.reason + note, {**verdict.numbers, "confirming_retry_after": first.number})


class NoRankStarted(Exception):
    """An attempt in which no rank ever started (`campaign.attempt.no_rank_started`): there is
    nothing for the stage to judge, and relaunching into the same cause helps nothing; the
    engine fails the stage with "no rank started: WHY"."""

    def __init__(self, why: str, attempt: int) -> None:
        super().__init__(why)
        self.why, self.attempt = why, attempt


@dataclass(frozen=True)
class Verdict:
    """A stage's outcome: pass or fail, the reason a human needs, and the numbers behind it."""

    passed: bool
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)
