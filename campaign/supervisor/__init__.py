"""The supervisor: the Parsl app that runs one attempt next to the launch.

It runs on the allocation's head node (locally for the `local` site). It reads the block's
node list (`PBS_NODEFILE`, `SLURM_JOB_NODELIST`, or the virtual nodes of the local site),
drops the nodes the ledger excludes, takes the active nodes, writes the hostfile, launches
the trainer with the site's launcher, and watches it:

- the stall watchdog (`campaign.watchdog`) reads metrics, events and heartbeats; on a stall
  it names the culprit nodes, then SIGTERMs the launch, again after 1 s (`SECOND_TERM_S`: the
  built-in trainer then exits at once), and SIGKILLs what is left after 5 s (`TERM_GRACE_S`;
  exit 124, class `stalled`); past the attempt's hard timeout (the stage's `timeout_s`) it
  does the same with one SIGTERM, class `timed_out` (its reason says the timeout, the step and how long since
  the last progress: not a stall);
- when one rank fails, the others get `FAILED_RANK_GRACE_S` to notice before the launch is
  stopped; the first failure is the evidence (behind srun, the failed task its log names as
  soon as srun writes it: srun keeps the peers up, `--kill-on-bad-exit=0`);
- a `STOP` file in the run directory (written by `campaign cancel`, or by a driver
  that recovers from a crash or took the lease over) stops the launch (class `cancelled`);
  so does the launch's guard (`campaign.guard`, started with the launch in a session of
  its own), which outlives this supervisor;
- before it stops a launch after a crash or a stall, a trainer that can (its `start` event
  says `rescue`) is asked to save a rescue checkpoint from one surviving replica
  (`campaign.train.rescue`): the relaunch then loses no step.

It returns its `AttemptReport` (campaign.attempt) as a plain dict, which survives Parsl's
serialization whichever version of the package the worker has; the driver reads it back
with `AttemptReport.from_dict`. It never touches the ledger: the driver ingests
`metrics.jsonl` and the report.

The package, by idea: `allocation` (which nodes), `launch` (start and stop a launch, its
first failure), `reading` (what the trainer writes or prints, behind `Observer.poll`),
`rules` (the watch loop as an ordered tuple of named rules), `rescue` (the rescue
checkpoint), `bisection` (the collective drill after a stall), `verdict` (from how the
watch ended to the exit class and who is blamed).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from campaign import exits, guard, report, rundir, runfiles, watchdog
from campaign.attempt import LAUNCH_FAILED, AttemptReport, AttemptRequest
from campaign.exits import ExitClass, StopReason
from campaign.rundir import PIDS_FILE, STOP_FILE
from campaign.supervisor import verdict
from campaign.supervisor.allocation import Nodes, block_nodes, choose, prepare
from campaign.supervisor.bisection import drill_summary
from campaign.supervisor.launch import TERM_GRACE_S, Failure, _Launch, free_port, launcher_failure, start
from campaign.supervisor.reading import (SEEN_KEPT, STDOUT_EVIDENCE, Observation, Observer, ProgressAdapter,
                                         _chain, _observe, note_checkpoints, observer, printed_between)
from campaign.supervisor.rescue import NOT_FAULTS, RESCUE_WAIT_S, RescueResult, _rescuer
from campaign.supervisor.rules import FAILED_RANK_GRACE_S, POLL_S, WATCH_RULES, WatchOutcome, watch_launch

__all__ = ["FAILED_RANK_GRACE_S", "NOT_FAULTS", "POLL_S", "RESCUE_WAIT_S", "SEEN_KEPT", "STDOUT_EVIDENCE", "STOP_FILE",
           "TERM_GRACE_S", "WATCH_RULES", "Failure", "Observation", "Observer", "ProgressAdapter", "RescueResult",
           "WatchOutcome", "_Launch", "_observe", "_rescuer", "block_nodes", "drill_summary", "free_port",
           "launcher_failure", "printed_between", "supervise"]


def supervise(request: AttemptRequest) -> dict[str, Any]:
    """Run one attempt described by `request` (`campaign.attempt.build_request`)."""
    run_dir = Path(request.run_dir)
    (run_dir / rundir.LOGS_DIR).mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    nodes = choose(request)
    if isinstance(nodes, AttemptReport):
        return _finish(run_dir, nodes)
    prepare(request, nodes.active)
    # Say a launch may start before looking for STOP: a driver that writes STOP and then finds
    # no pids.json knows no launch will start (campaign.recovery.stop_orphan).
    report.write_json_atomic(run_dir / PIDS_FILE, {"host": socket.gethostname(), "pgids": [], "starting": True,
                                                   "block_job_id": os.environ.get("PBS_JOBID")
                                                   or os.environ.get("SLURM_JOB_ID"), "attempt": request.attempt})
    if (run_dir / STOP_FILE).exists():
        return _finish(run_dir, AttemptReport(
            exit_code=exits.SIGTERM, exit_class=ExitClass.CANCELLED, duration_s=0.0, nodes=nodes.active,
            allocation=nodes.allocation, spares=nodes.spares, killed_by=StopReason.STOP.value,
            error="stopped before the launch started (STOP)"))
    from campaign.executors import launchers

    plan = request.launch_plan(nodes.active)
    try:
        launch, command = start(request, plan)
    except OSError as e:  # the launcher or the trainer's program cannot be executed: no rank ever ran
        return _finish(run_dir, AttemptReport(
            exit_code=exits.BROKEN_ENV, exit_class=ExitClass.CRASHED_SYSTEMIC, duration_s=time.time() - t0,
            nodes=nodes.active, allocation=nodes.allocation, error=f"{LAUNCH_FAILED}: {e}"))
    guard.start(run_dir, [p.pid for _, _, p in launch.procs])  # STOP is honoured even once this supervisor is gone
    out = _watched(request, nodes, launch, t0)
    out.launch_command, out.launch_text = command, launchers.render(request.launcher, plan)
    return _finish(run_dir, out)


def _watched(request: AttemptRequest, nodes: Nodes, launch: _Launch, t0: float) -> AttemptReport:
    """Watch the launch (`rules.WATCH_RULES`) and report how it ended."""
    run_dir, active = Path(request.run_dir), nodes.active
    reader = observer(request, launch, t0)
    watched = watch_launch(launch, request, active, t0, reader)
    last = reader.last(time.time())  # what rank 0 printed just before it exited
    if last is not None and request.checkpoint_layout is not None:
        note_checkpoints(request, last.seen, t0)
    metrics, _ = runfiles.read_metrics(run_dir, chain=_chain(request), final=True)
    failure, finding = verdict.crash(launch, run_dir, watched, active, first_step=bool(metrics))
    code = verdict.exit_code(watched, failure)
    beats = runfiles.read_heartbeats(run_dir)
    for node in active:  # what a killed launch left on node-local storage (this host's nodes only)
        report.remove_node_local(run_dir, node, str(request.attempt))
    suspects, stall = verdict.blame(request, active, watched, finding, reader.stdout)
    return AttemptReport(
        exit_code=code, exit_class=verdict.exit_class(watched.killed_by, code, finding, bool(suspects)),
        duration_s=round(time.time() - t0, 3), nodes=active, allocation=nodes.allocation, spares=nodes.spares,
        killed_by=None if watched.killed_by is None else watched.killed_by.value, stall=stall,
        first_failure=None if failure is None else failure.to_dict(t0), suspects=[s.to_dict() for s in suspects],
        last_step=metrics[-1]["step"] if metrics else None, detected_after_s=watched.detected_after_s,
        stragglers=watchdog.stragglers(beats, request.watchdog.straggler_ratio),
        finding=finding.to_dict() if finding else None, error=finding.message if finding and code else None,
        rescue=None if watched.rescue is None else watched.rescue.to_dict(),
    )


def _finish(run_dir: Path, out: AttemptReport) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)  # deleted under the attempt: the report still reaches the driver
    report.write_json_atomic(run_dir / rundir.SUPERVISOR_REPORT, out.to_dict())
    return out.to_dict()
