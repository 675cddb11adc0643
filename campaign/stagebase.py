"""What every stage kind shares: its spec base class and its verdict.

A stage module in `stages/` defines one pydantic spec class (a subclass of `StageSpec`
with a literal `kind`), `first_targets(stage, spec, nodes) -> Targets` (what its first
attempt must do; the dry run calls it too), a pure `judge(...) -> Verdict`, and `run(ctx, stage) -> Verdict`,
which asks its `Context` for attempts (`Outcome`s) and judges their results. Stage modules
import only pydantic and the standard library at import time, so validating a spec never
imports torch or parsl. `Context` and `Outcome` are what a stage may use of the driver's
`campaign.stagecontext.StageContext` and `AttemptOutcome`: a stage module never names the
driver, not even for a type (tests/unit/test_type_imports.py).

What the rest of the project asks of a stage (the spec's checks, the dry run, the walltime
check, the custom-trainer warnings, the checkpoint interval) are `StageSpec` methods with a
default here, overridden by the kinds that differ: adding a kind touches its own module only
(tests/unit/test_stage_contract.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from campaign import names

if TYPE_CHECKING:
    from campaign.ledger import Ledger
    from campaign.ledger.models import StageRun
    from campaign.train.config import Fault

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base of every spec model: unknown keys are errors; docstrings document fields."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


def validated_copy(model: M, **update: Any) -> M:
    """`model` with the fields in `update` replaced, validated as a new instance (pydantic's
    `model_copy(update=...)` validates nothing): a wrong type, an out-of-range value or an
    unknown field raises ValueError in one line naming the model and the field, e.g.
    "TrainConfig.checkpoint_every: Input should be greater than or equal to 0 (got -1)". The
    fields that were set stay the set ones (plus `update`), as with `model_copy`."""
    try:
        return type(model).model_validate({**model.model_dump(exclude_unset=True), **update})
    except ValidationError as e:
        name = type(model).__name__
        raise ValueError("; ".join(f"{'.'.join(str(p) for p in (name, *err['loc']))}: {err['msg']}"
                                   + (f" (got {err['input']!r})" if err["loc"] else "")  # else: the whole model
                                   for err in e.errors())) from None


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


class AttemptFacts(Protocol):
    """What a stage reads of an attempt's report (`campaign.attempt.AttemptReport`)."""

    @property
    def stall(self) -> str | None: ...
    @property
    def stragglers(self) -> list[dict[str, Any]]: ...
    @property
    def rescue(self) -> dict[str, Any] | None: ...
    @property
    def finding(self) -> dict[str, Any] | None: ...


class Outcome(Protocol):
    """One finished attempt as a stage sees it (`campaign.stagecontext.AttemptOutcome`): the
    supervisor's report plus what the trainer wrote."""

    @property
    def attempt_id(self) -> int: ...
    @property
    def number(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def report(self) -> AttemptFacts: ...
    @property
    def metrics(self) -> list[dict[str, Any]]: ...
    @property
    def exit_code(self) -> int: ...
    @property
    def exit_class(self) -> str: ...
    @property
    def suspects(self) -> list[dict[str, Any]]: ...
    @property
    def last_step(self) -> int | None: ...
    @property
    def losses(self) -> dict[int, float]: ...
    @property
    def rank0_log(self) -> Path: ...
    def as_dict(self) -> dict[str, Any]:
        """The outcome as plain data, for a stage's pure `judge`."""
        ...


class Context(Protocol):
    """What a stage module may do, and all it may see of the driver (`campaign.stagecontext.
    StageContext` does it): launch attempts, exclude nodes, record events, read references and
    the ledger. The outcomes a stage hands back (to `confirm`, `exclude_suspects`, ...) are
    those this context gave it."""

    @property
    def spec(self) -> Any:
        """The campaign's spec (`campaign.spec.CampaignSpec`)."""
        ...

    @property
    def run(self) -> StageRun:
        """The stage run's ledger row, as it was when the stage started."""
        ...

    @property
    def stage_dir(self) -> Path:
        """The stage's folder: its attempts' run directories and checkpoint folders."""
        ...

    @property
    def ledger(self) -> Ledger: ...

    def launch(self, targets: Targets, *, nodes: int | None = None, timeout_s: float, faults: tuple[Fault, ...] = (),
               label: str = "", interrupt: dict[str, Any] | None = None, watchdog: Any = None,
               rotate: int = 0) -> Outcome:
        """One attempt to `targets`, recorded and ingested (`watchdog`: a `campaign.watchdog.WatchdogPolicy`)."""
        ...

    def launch_confirmed(self, targets: Targets, *, retry_targets: Targets | None = None,
                         before_retry: Callable[[Outcome], Targets | None] | None = None,
                         **kw: Any) -> tuple[Outcome, Outcome | None]: ...

    def confirm(self, first: Outcome, retry: Outcome) -> Outcome: ...

    def attempts_made(self) -> int: ...

    def stage_progress(self) -> dict[str, Any]: ...

    def reference_losses(self, ref: Any) -> dict[int, float]:
        """Losses by step of a `campaign.reference.Reference`."""
        ...

    def show_table(self, title: str, rows: list[dict[str, Any]], columns: list[str]) -> None: ...

    def event(self, kind: str, message: str, *, attempt_id: int | None = None,
              data: dict[str, Any] | None = None) -> None: ...

    def exclude_suspects(self, outcome: Outcome, *, hours: float | None,
                         only: list[str] | None = None) -> list[str]: ...

    def exclude_stragglers(self, outcome: Outcome, *, hours: float | None) -> list[str]: ...

    def drill_of(self, outcome: Outcome) -> str | None: ...


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


def after_retry(verdict: Verdict, first: Outcome | None) -> Verdict:
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
