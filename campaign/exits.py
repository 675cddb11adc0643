"""The exit classes of attempts, from the exit codes of the trainer contract (`campaign.report`),
and what follows each (`POLICY`).

An attempt ends in exactly one class (`ExitClass`; its value is the attempt's state in the
ledger). `walltime` is the scheduler's expected deadline (a checkpoint-and-resubmit, not a
failure), so it is kept apart from the failures, and `crashed_systemic` (never a node's fault)
apart from `crashed_node`. `POLICY` is the one table of what follows each class
(`NextAction`); a stage applies it within its own budgets (attempts, crash loop, exclusions).

    exits.follows(outcome.exit_class) is NextAction.CONFIRM   # one confirming retry
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType

from campaign.report import EXIT_BAD_CONFIG as NO_RETRY
from campaign.report import EXIT_BROKEN_ENV as BROKEN_ENV
from campaign.report import EXIT_NONFINITE as NONFINITE
from campaign.report import EXIT_OK as OK
from campaign.report import EXIT_SIGKILL as SIGKILL
from campaign.report import EXIT_SIGTERM as SIGTERM
from campaign.report import EXIT_WATCHDOG as STALLED

__all__ = ["BROKEN_ENV", "CLASSES", "CONFIRM_ONCE", "NONFINITE", "NO_RETRY", "OK", "POLICY", "RESUMABLE", "SIGKILL",
           "SIGTERM", "STALLED", "ExitClass", "NextAction", "StopReason", "classify", "classify_finding", "follows"]

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # Python 3.10 (pyproject's floor): str() and format() give the value, as 3.11's StrEnum does
    class StrEnum(str, Enum):
        def __str__(self) -> str:
            return str(self.value)


class ExitClass(StrEnum):
    """How an attempt ended (`CLASSES` says what each means). A member is its string: it
    compares equal to, hashes as and prints as the value the ledger stores."""

    SUCCEEDED = "succeeded"
    STALLED = "stalled"
    TIMED_OUT = "timed_out"
    CRASHED_NODE = "crashed_node"
    CRASHED_SYSTEMIC = "crashed_systemic"
    WALLTIME = "walltime"
    CANCELLED = "cancelled"
    CONFIG_ERROR = "config_error"
    DIVERGED = "diverged"
    ORPHANED = "orphaned"
    BLOCK_LOST = "block_lost"
    CRASHED_UNKNOWN = "crashed_unknown"


CLASSES: dict[ExitClass, str] = {
    ExitClass.SUCCEEDED: "the trainer finished",
    ExitClass.STALLED: "no progress within the budget; killed (124)",
    ExitClass.TIMED_OUT: "the attempt's hard timeout (the stage's timeout_s) passed; killed (124), progress or not",
    ExitClass.CRASHED_NODE: "a failure with evidence against a node",
    ExitClass.CRASHED_SYSTEMIC: "a failure no node swap can fix (127, import errors, same failure on different nodes)",
    ExitClass.WALLTIME: "the scheduler's deadline: checkpoint and resubmit, not a failure",
    ExitClass.CANCELLED: "stopped by a user",
    ExitClass.CONFIG_ERROR: "bad configuration (93): do not retry",
    ExitClass.DIVERGED: "non-finite loss (94)",
    ExitClass.ORPHANED: "lost by what watched it (its driver died or was displaced, its run directory was deleted); "
                        "its launch was stopped",
    ExitClass.BLOCK_LOST: "the block (scheduler job) ended under the attempt: cancelled by someone, or its nodes failed",
    ExitClass.CRASHED_UNKNOWN: "a failure without enough evidence to blame a node or call it systemic: one confirming "
                               "retry",
}
"""What each exit class means, in a line."""


class NextAction(StrEnum):
    """What follows an attempt that ended in a class (`POLICY`). A stage applies it within its
    own budgets: its attempts, its crash loop, its exclusions (`stages/long_run.py`)."""

    DONE = "done"
    """The trainer finished: nothing follows."""
    RESUME = "resume"
    """Relaunch from the last complete checkpoint (in the new block Parsl starts, when the
    old one ended): nothing the trainer or a node did."""
    EXCLUDE_AND_RESUME = "exclude_and_resume"
    """Exclude the suspect nodes (with their evidence), then relaunch from the last complete
    checkpoint on the remaining nodes."""
    CONFIRM = "confirm"
    """One confirming relaunch with the ranks moved to other nodes, nobody excluded; the two
    failures together decide (`campaign.evidence.confirm`): the node, or systemic."""
    RETRY_AFTER_BACKOFF = "retry_after_backoff"
    """Systemic (no node swap fixes it, none is blamed): one retry after a backoff (a file
    system can come back), none when the evidence says retrying cannot help."""
    STOP = "stop"
    """Stop: retrying cannot help (a bad configuration, a diverged run, a user's cancel)."""


POLICY: Mapping[ExitClass, NextAction] = MappingProxyType({
    ExitClass.SUCCEEDED: NextAction.DONE,
    ExitClass.STALLED: NextAction.EXCLUDE_AND_RESUME,
    ExitClass.TIMED_OUT: NextAction.RESUME,
    ExitClass.CRASHED_NODE: NextAction.EXCLUDE_AND_RESUME,
    ExitClass.CRASHED_SYSTEMIC: NextAction.RETRY_AFTER_BACKOFF,
    ExitClass.WALLTIME: NextAction.RESUME,
    ExitClass.CANCELLED: NextAction.STOP,
    ExitClass.CONFIG_ERROR: NextAction.STOP,
    ExitClass.DIVERGED: NextAction.STOP,
    ExitClass.ORPHANED: NextAction.RESUME,
    ExitClass.BLOCK_LOST: NextAction.RESUME,
    ExitClass.CRASHED_UNKNOWN: NextAction.CONFIRM,
})
"""What follows each exit class: the one table (a test checks one entry per class)."""

RESUMABLE = frozenset(c for c, a in POLICY.items() if a in (NextAction.RESUME, NextAction.EXCLUDE_AND_RESUME))
"""Classes after which a relaunch from the last complete checkpoint makes sense."""
CONFIRM_ONCE = frozenset(c for c, a in POLICY.items() if a is NextAction.CONFIRM)
"""Classes after which one relaunch (no exclusion) confirms or clears the suspicion
(`campaign.evidence.confirm` compares the two attempts)."""


def follows(exit_class: str | None) -> NextAction:
    """What follows an attempt that ended in `exit_class` (a member, or its string as the
    ledger and the report dicts hold it); a class this release does not know stops."""
    try:
        return POLICY[ExitClass(exit_class)]
    except ValueError:
        return NextAction.STOP


def classify(code: int, *, suspects: bool) -> ExitClass:
    """The exit class of an attempt from its exit code and whether a node was blamed."""
    if code == OK:
        return ExitClass.SUCCEEDED
    if code == STALLED:
        return ExitClass.STALLED
    if code == SIGTERM:
        return ExitClass.WALLTIME
    if code == NO_RETRY:
        return ExitClass.CONFIG_ERROR
    if code == NONFINITE:
        return ExitClass.DIVERGED
    if code == BROKEN_ENV:
        return ExitClass.CRASHED_SYSTEMIC
    return ExitClass.CRASHED_NODE if suspects else ExitClass.CRASHED_SYSTEMIC


def classify_finding(code: int, kind: str) -> ExitClass:
    """The exit class of a crashed attempt from its exit code and `campaign.evidence.Finding.kind`
    ("node", "systemic", "unknown"): the contract's codes keep their classes; only a "node"
    finding gives `crashed_node`, an "unknown" one `crashed_unknown`."""
    by_code = classify(code, suspects=False)
    if by_code != ExitClass.CRASHED_SYSTEMIC or code == BROKEN_ENV:
        return by_code
    return {"node": ExitClass.CRASHED_NODE, "unknown": ExitClass.CRASHED_UNKNOWN}.get(kind, ExitClass.CRASHED_SYSTEMIC)


class StopReason(StrEnum):
    """Why the supervisor stopped a launch (`AttemptReport.killed_by`; None: it ended by itself
    or after a rank failed). The values are the strings the report and the ledger store."""

    STOP = "stop"
    """The run directory's STOP file (`campaign cancel`, a recovering driver, a takeover)."""
    INTERRUPT = "interrupt"
    """The deliberate interruption of a resume test (`attempt.Interrupt`)."""
    RUNDIR_LOST = "rundir_lost"
    """The run directory was deleted under the launch."""
    EXIT_HUNG = "exit_hung"
    """The trainer finished (its last event says how) but the launch did not exit."""
    STALLED = "stalled"
    """The stall watchdog: no progress within the budget."""
    TIMEOUT = "timeout"
    """The attempt's hard timeout (the stage's timeout_s)."""
