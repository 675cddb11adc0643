"""Exit codes of the trainer contract and the exit classes of attempts.

An attempt ends in exactly one class. `walltime` is the scheduler's expected deadline (a
checkpoint-and-resubmit, not a failure), so it is kept apart from the failures, and
`crashed_systemic` (never a node's fault) apart from `crashed_node`.
"""

from __future__ import annotations

OK = 0
STALLED = 124
"""Killed by the watchdog (or the stage's hard timeout)."""
SIGTERM = 143
"""SIGTERM: the scheduler's walltime or a cancel."""
SIGKILL = 137
"""SIGKILL, often the kernel's OOM killer."""
BROKEN_ENV = 127
"""The environment is broken (e.g. an import failed): systemic, never a node's fault."""
NO_RETRY = 93
"""Bad configuration: retrying cannot help."""
NONFINITE = 94
"""The loss became NaN or infinite: the run stopped instead of training on."""

CLASSES = {
    "succeeded": "the trainer finished",
    "stalled": "no progress within the budget; killed (124)",
    "crashed_node": "a failure with evidence against a node",
    "crashed_systemic": "a failure no node swap can fix (127, import errors, same failure on different nodes)",
    "walltime": "the scheduler's deadline: checkpoint and resubmit, not a failure",
    "cancelled": "stopped by a user",
    "config_error": "bad configuration (93): do not retry",
    "diverged": "non-finite loss (94)",
    "orphaned": "left running by an orchestrator that died; its job was cancelled",
}
RESUMABLE = frozenset({"stalled", "crashed_node", "walltime", "orphaned"})
"""Classes after which a relaunch from the last complete checkpoint makes sense."""


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
