"""Every file of a campaign's run directories, each named here once (stdlib only).

    <workdir>/<campaign>/               the campaign directory
      driver.json                       DRIVER_FILE: the driver's host and pid, its Parsl interchange's
                                        pid and run directory, for a successor (`campaign.recovery`)
      [vN/]<stage>/                     a stage's directory (`vN/` from the second version on)
        checkpoints/...                 the trainer's checkpoints (the trainer contract)
        attempt-NNN/                    attempt_dir(): one attempt's run directory, CAMPAIGN_RUN_DIR
          trainer.json                  TRAINER_CONFIG: what this attempt must do (the driver writes it)
          hostfile                      HOSTFILE: the active nodes, one a line (the supervisor writes it)
          srun-tasks                    SRUN_TASKS: each rank's node, one a line in rank order (srun's
                                        SLURM_HOSTFILE; the supervisor writes it)
          pids.json                     PIDS_FILE: host and process groups of the launch (the supervisor),
                                        so a recovering driver can kill orphans
          STOP                          STOP_FILE: stops the launch (cancel, recovery, a take-over): its
                                        supervisor and its guard (`campaign.guard`) read it
          launch-gone.json              LAUNCH_GONE: the guard's word that the launch's processes are gone
          supervisor.json               SUPERVISOR_REPORT: the supervisor's report of the attempt
          drills/<nodes>/               drill_dir(): a bisection drill's run directory
          logs/rank-R.log               rank_log(): rank R's output (local launcher)
          logs/rank-R.pid               rank_pid_file(): rank R's own process (group) when a warm-start
                                        server forked it (local launcher; `campaign inject` signals it)
          logs/launcher.log             launcher_log(): the launcher's output (mpiexec, srun, torchrun)
          metrics.jsonl events.jsonl startup.json heartbeats/   the trainer's files (the trainer
                                        contract, `campaign.report`: METRICS_FILE, EVENTS_FILE, ...)
          rescue-request.json           RESCUE_REQUEST_FILE: the supervisor asks one rank to save
          rescue.json                   RESCUE_RESULT_FILE: that rank's answer (`campaign.train.rescue`)
          injected.json                 INJECTED_FILE: `campaign inject` sent this attempt a fault (a drill)

The supervisor, the driver, recovery, the trainer's contract helper and the trainer take
their names from here; the trainer contract (`docs/trainer-contract.md`) documents the
trainer's own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DRIVER_FILE = "driver.json"
"""In the campaign directory: the driver's host and pid and its Parsl interchange's, for a successor."""

TRAINER_CONFIG = "trainer.json"
"""The attempt's trainer config (`campaign.train.config.TrainerConfig`), written by the driver."""
HOSTFILE = "hostfile"
"""The attempt's active nodes, one a line, in rank order."""
SRUN_TASKS = "srun-tasks"
"""srun only: each rank's node, one a line in rank order (SLURM_HOSTFILE, arbitrary distribution)."""
STOP_FILE = "STOP"
"""Written into the run directory to ask the supervisor to stop the launch (cancel)."""
PIDS_FILE = "pids.json"
"""Host and process groups of the launch, so a recovering driver can kill orphans. Written
before the launch starts (empty `pgids`, `starting`), then with its process groups."""
LAUNCH_GONE = "launch-gone.json"
"""Written by the launch's guard (`campaign.guard`) once every process of the launch is gone:
a driver on another host relaunches only after it (or the supervisor's report) appears."""
SUPERVISOR_REPORT = "supervisor.json"
"""The supervisor's report (`campaign.attempt.AttemptReport`), written when the attempt ends."""
LOGS_DIR = "logs"
"""The ranks' and the launcher's output."""
LAUNCHER_LOG = "launcher.log"

METRICS_FILE = "metrics.jsonl"
"""Rank 0's metrics, one JSON object per step (the trainer contract)."""
EVENTS_FILE = "events.jsonl"
"""The trainer's events (start, checkpoints, done, ...), one JSON object a line."""
STARTUP_FILE = "startup.json"
"""The startup check's answer (every rank reported, the all-reduce's sum)."""
HEARTBEAT_DIR = "heartbeats"
"""Group files with one slot per node (`campaign.report`)."""

RESCUE_REQUEST_FILE = "rescue-request.json"
"""Written by the supervisor: {"rank": R} (the rank that saves), then SIGUSR1."""
RESCUE_RESULT_FILE = "rescue.json"
"""Written by the rank that was asked: {"saved": bool, "step", "path", "seconds", "why"}."""
INJECTED_FILE = "injected.json"
"""Written by `campaign inject` before it signals a rank: {"fault", "rank", "step", ...}. The
driver reads it: an exclusion that follows a drill binds that campaign only."""


def attempt_dir(stage_dir: Path, number: int) -> Path:
    """The run directory of attempt `number` of a stage."""
    return stage_dir / f"attempt-{number:03d}"


def drill_dir(run_dir: Path, nodes: list[str]) -> Path:
    """Where a bisection drill on `nodes` runs (its own hostfile, logs and metrics)."""
    return run_dir / "drills" / "-".join(nodes)


def rank_log(run_dir: Path, rank: int) -> Path:
    """Rank `rank`'s output when the supervisor starts each rank itself (local launcher)."""
    return run_dir / LOGS_DIR / f"rank-{rank}.log"


RANK_PID_ENV = "CAMPAIGN_RANK_PIDFILE"
"""Set by the supervisor for each rank of the local launcher: where a warm-start client writes
the pid of the process the node's server forked for it (its own process group)."""


def rank_pid_file(run_dir: Path, rank: int) -> Path:
    """Rank `rank`'s process when it is not the launched one: a warm-start server's child,
    in its own process group (the launched client only relays to it, and SIGSTOP cannot be
    relayed). Local launcher only; absent for a rank started cold."""
    return run_dir / LOGS_DIR / f"rank-{rank}.pid"


def launcher_log(run_dir: Path) -> Path:
    """The launcher's output (mpiexec, srun, torchrun: every rank's, interleaved)."""
    return run_dir / LOGS_DIR / LAUNCHER_LOG


def launched_nodes(run_dir: Path) -> list[str]:
    """The active nodes the supervisor launched an attempt on (its HOSTFILE), [] before it wrote one."""
    try:
        return (run_dir / HOSTFILE).read_text().split()
    except OSError:
        return []


def write_stop(run_dir: Path) -> bool:
    """Write the STOP file of an attempt, making its run directory again if it was deleted (the
    launch's guard and supervisor look for STOP at that path); False if it cannot be written."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / STOP_FILE).touch()
    except OSError:
        return False
    return True


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file of the run directory (pids.json, launch-gone.json, injected.json, ...),
    or None when it is missing, cut short or not an object: its writer may have died mid-way."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
