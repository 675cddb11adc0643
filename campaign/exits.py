"""The exit classes of attempts, from the exit codes of the trainer contract (`campaign.report`).

An attempt ends in exactly one class. `walltime` is the scheduler's expected deadline (a
checkpoint-and-resubmit, not a failure), so it is kept apart from the failures, and
`crashed_systemic` (never a node's fault) apart from `crashed_node`.
"""

from __future__ import annotations

from campaign.report import EXIT_BAD_CONFIG as NO_RETRY
from campaign.report import EXIT_BROKEN_ENV as BROKEN_ENV
from campaign.report import EXIT_NONFINITE as NONFINITE
from campaign.report import EXIT_OK as OK
from campaign.report import EXIT_SIGKILL as SIGKILL
from campaign.report import EXIT_SIGTERM as SIGTERM
from campaign.report import EXIT_WATCHDOG as STALLED

__all__ = ["BROKEN_ENV", "CLASSES", "CONFIRM_ONCE", "NONFINITE", "NO_RETRY", "OK", "RESUMABLE", "SIGKILL", "SIGTERM",
           "STALLED", "classify", "classify_finding"]

CLASSES = {
    "succeeded": "the trainer finished",
    "stalled": "no progress within the budget; killed (124)",
    "timed_out": "the attempt's hard timeout (the stage's timeout_s) passed; killed (124), progress or not",
    "crashed_node": "a failure with evidence against a node",
    "crashed_systemic": "a failure no node swap can fix (127, import errors, same failure on different nodes)",
    "walltime": "the scheduler's deadline: checkpoint and resubmit, not a failure",
    "cancelled": "stopped by a user",
    "config_error": "bad configuration (93): do not retry",
    "diverged": "non-finite loss (94)",
    "orphaned": "lost by what watched it (its driver died or was displaced, its run directory was deleted); its launch "
                "was stopped",
    "block_lost": "the block (scheduler job) ended under the attempt: cancelled by someone, or its nodes failed",
    "crashed_unknown": "a failure without enough evidence to blame a node or call it systemic: one confirming retry",
}
RESUMABLE = frozenset({"stalled", "timed_out", "crashed_node", "walltime", "orphaned", "block_lost"})
"""Classes after which a relaunch from the last complete checkpoint makes sense."""
CONFIRM_ONCE = frozenset({"crashed_unknown"})
"""Classes after which one relaunch (no exclusion) confirms or clears the suspicion
(`campaign.evidence.confirm` compares the two attempts)."""


def classify(code: int, *, suspects: bool) -> str:
    """The exit class of an attempt from its exit code and whether a node was blamed."""
    if code == OK:
        return "succeeded"
    if code == STALLED:
        return "stalled"
    if code == SIGTERM:
        return "walltime"
    if code == NO_RETRY:
        return "config_error"
    if code == NONFINITE:
        return "diverged"
    if code == BROKEN_ENV:
        return "crashed_systemic"
    return "crashed_node" if suspects else "crashed_systemic"


def classify_finding(code: int, kind: str) -> str:
    """The exit class of a crashed attempt from its exit code and `campaign.evidence.Finding.kind`
    ("node", "systemic", "unknown"): the contract's codes keep their classes; only a "node"
    finding gives `crashed_node`, an "unknown" one `crashed_unknown`."""
    by_code = classify(code, suspects=False)
    if by_code != "crashed_systemic" or code == BROKEN_ENV:
        return by_code
    return {"node": "crashed_node", "unknown": "crashed_unknown"}.get(kind, "crashed_systemic")


import enum  # noqa: E402  (kept beside the class appended last; see StopReason)


class StopReason(enum.StrEnum):
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
