"""From how the watch ended to the report's verdict: the first failure, what the evidence says
of a crash (`campaign.evidence.assess`), who is blamed, the exit code and the exit class."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from campaign import evidence, exits, rundir
from campaign.evidence import Finding, Suspect
from campaign.exits import ExitClass, StopReason
from campaign.supervisor.bisection import drill_suspects
from campaign.supervisor.launch import Failure, _Launch, launcher_failure
from campaign.supervisor.reading import STDOUT_EVIDENCE

if TYPE_CHECKING:
    from campaign.attempt import AttemptRequest
    from campaign.supervisor.rescue import RescueResult
    from campaign.supervisor.rules import WatchOutcome

HUNG_EXIT_CODES = {"done": exits.OK, "deadline": exits.SIGTERM, "nonfinite_loss": exits.NONFINITE}
"""The exit code of a launch stopped after its trainer finished (exit_hung), from the trainer's last event."""
KILLED = (StopReason.STALLED, StopReason.TIMEOUT)
"""The supervisor's own kills of a launch that made no progress: exit 124."""
STOPPED_CLASSES = {StopReason.STOP: ExitClass.CANCELLED, StopReason.INTERRUPT: ExitClass.CANCELLED,
                   StopReason.RUNDIR_LOST: ExitClass.ORPHANED, StopReason.TIMEOUT: ExitClass.TIMED_OUT}
"""The exit classes a stop decides by itself, whatever the exit code (`orphaned`: nothing the
trainer or a node did, resumable); after the others the exit code and the evidence decide."""


class Crash(NamedTuple):
    """The first failure of a launch and, where no rule of the watch stopped it, the finding."""

    failure: Failure | None
    finding: Finding | None


def crash(launch: _Launch, run_dir: Path, watched: WatchOutcome, active: list[str], first_step: bool) -> Crash:
    """The first failed rank (as the launcher's log names it) and, for a launch that failed by
    itself, what the evidence says; the finding's primary failure replaces the first one."""
    failure = launch.first_failure() or launch.logged_failure(time.time())
    if failure is not None and failure.rank == -1:  # one launcher process: its log names the rank
        failure = launcher_failure(rundir.launcher_log(run_dir), failure)
    if watched.killed_by is not None or failure is None:
        return Crash(failure, None)
    finding = evidence.assess(_rank_exits(launch, run_dir, failure, watched.rescue), first_step=first_step,
                              nodes=active, same_poll_s=1.0)
    if finding.primary:
        p = finding.primary
        failure = Failure(p.rank, p.exit_code, p.node, failure.seen)
    return Crash(failure, finding)


def exit_code(watched: WatchOutcome, failure: Failure | None) -> int:
    """124 for a stall or a timeout; the trainer's last event's for a launch that hung on exit;
    else the first failure's (0: none)."""
    if watched.killed_by == StopReason.EXIT_HUNG:  # the trainer's own last event says how it ended
        return HUNG_EXIT_CODES.get(watched.final_event or "", exits.STALLED)
    if watched.killed_by in KILLED:
        return exits.STALLED
    return failure.exit_code if failure else 0


def blame(request: AttemptRequest, active: list[str], watched: WatchOutcome, finding: Finding | None,
          stdout: bool) -> tuple[list[Suspect], str | None]:
    """The suspects and the stall's description. A rank that failed by itself may be evidence
    (the finding says); ranks the supervisor stopped are not. A stall nobody is blamed for
    bisects the allocation with a collective drill."""
    policy = request.watchdog
    suspects = watched.suspects if watched.killed_by is not None else list(finding.suspects) if finding else []
    stall = watched.stall
    if watched.killed_by == StopReason.STALLED and not suspects and len(active) > 1 and policy.drill_s > 0:
        suspects, stall = drill_suspects(request, active, policy, stall)
    if watched.killed_by in KILLED and stdout:
        stall = f"{stall}; {STDOUT_EVIDENCE}"
    return suspects, stall


def exit_class(killed_by: StopReason | None, code: int, finding: Finding | None, suspects: bool) -> str:
    """The attempt's exit class (`campaign.exits.CLASSES`)."""
    if killed_by is not None and killed_by in STOPPED_CLASSES:
        return STOPPED_CLASSES[killed_by]
    if finding is not None:
        return exits.classify_finding(code, finding.kind)
    return exits.classify(code, suspects=suspects)


def _rank_exits(launch: _Launch, run_dir: Path, failure: Failure,
                rescue_asked: RescueResult | None = None) -> list[evidence.RankExit]:
    """The evidence of a crash: every rank's exit with the tail of its log (local launcher),
    or the failed rank the launcher named with its lines of the launcher's log. The rescuer's
    exit after it was asked to save is no evidence against its node (it is counted as
    stopped): it worked on after its peer failed, and whatever killed it mid-save, its node
    did not fail the launch."""
    stopped = launch.stopped_at
    if launch.one_launcher:  # mpiexec, srun
        log = rundir.launcher_log(run_dir)
        rank, code, node, seen = failure
        lines = evidence.split_by_rank(evidence.read_tail(log, lines=500))
        tail = tuple((lines.get(rank) or lines.get(None) or [])[-evidence.TAIL_LINES:])
        return [evidence.RankExit(rank, node, code, seen, log_path=str(log), log_tail=tail)]
    out = []
    for i, (rank, node, _) in enumerate(launch.procs):
        if i in launch.exits:
            code, seen = launch.exits[i]
            log = rundir.rank_log(run_dir, rank)
            rescuer = rescue_asked is not None and rescue_asked.stopped_rescuer(rank, seen)
            out.append(evidence.RankExit.from_popen(rank, node, code, seen, log_path=str(log),
                                                    log_tail=evidence.read_tail(log),
                                                    stopped=(stopped is not None and seen >= stopped) or rescuer))
    return out
