"""Start and stop a launch: one process per rank (local) or one launcher process (mpiexec,
srun), each in a session of its own; the first rank that failed, from the processes' exits
or from what the launcher's log says."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from campaign import exits, report, rundir
from campaign.executors import warm
from campaign.rundir import PIDS_FILE

if TYPE_CHECKING:
    from campaign.attempt import AttemptRequest
    from campaign.executors.launchers import LaunchPlan

TERM_GRACE_S = 5.0
"""Between SIGTERM and SIGKILL when the supervisor stops a launch."""
SECOND_TERM_S = 1.0
"""After a stall, a second SIGTERM this long after the first; SIGKILL still at TERM_GRACE_S. A
hung rank cannot finish a step, so the first SIGTERM's stop at a step boundary never comes
(the built-in trainer would exit 143 only after CAMPAIGN_SIGTERM_GRACE, 20 s), and what a
deadline's save would keep the rescue checkpoint has kept or could not. A second SIGTERM ends
the built-in trainer at once (`campaign.train.signals`, the trainer contract): with the local
launcher (one process group per rank) it exits by itself 1 s after the first, not SIGKILLed
at 5 s (tests/engine/test_engine_in_process.py; behind mpiexec the same where it forwards
both, not measured); a trainer deaf to both is SIGKILLed at TERM_GRACE_S, as before.
srun needs neither: it answers the first SIGTERM by cancelling the step ("srun: forcing job
termination", its tasks SIGKILLed by slurmstepd: the launcher log of every stall of the
Slurm goodput benchmark) and exits once the step is gone."""


class Failure(NamedTuple):
    """The first rank of a launch that exited non-zero."""

    rank: int
    """-1 while only the launcher process (mpiexec, srun) is known to have failed: its log names the rank."""
    exit_code: int
    node: str
    seen: float
    """When the supervisor saw the exit (time.time())."""

    def to_dict(self, start: float) -> dict[str, int | str | float]:
        """The report's `first_failure`: `after_s` since the attempt's `start`."""
        return {"rank": self.rank, "exit_code": self.exit_code, "node": self.node,
                "after_s": round(self.seen - start, 3)}


@dataclass
class _Launch:
    """A running launch: one process per rank (local) or one launcher process (mpiexec, srun)."""

    procs: list[tuple[int, str, subprocess.Popen[bytes]]]  # (rank or -1 for a launcher, node, process)
    exits: dict[int, tuple[int, float]] = field(default_factory=dict)  # index -> (code, time)
    stopped_at: float | None = None  # when the supervisor first signalled the launch: later exits are not evidence
    log: Path | None = None
    """The launcher's output (one launcher process), read as it grows for a rank's failure."""
    _log_offset: int = 0
    _logged: Failure | None = None

    @property
    def one_launcher(self) -> bool:
        """One launcher process (mpiexec, srun) rather than one process per rank."""
        return bool(self.procs) and self.procs[0][0] == -1

    def poll(self, now: float) -> None:
        for i, (_, _, p) in enumerate(self.procs):
            if i not in self.exits and (code := p.poll()) is not None:
                self.exits[i] = (code, now)

    @property
    def done(self) -> bool:
        return len(self.exits) == len(self.procs)

    def first_failure(self) -> Failure | None:
        failed = [(t, i, c) for i, (c, t) in self.exits.items() if c != 0]
        if not failed:
            return None
        t, i, code = min(failed)
        rank, node, _ = self.procs[i]
        return Failure(rank, _norm(code), node, t)

    def logged_failure(self, now: float) -> Failure | None:
        """A rank's failure that the launcher logged while it still runs (srun, run with
        `--kill-on-bad-exit=0`, keeps the failed task's peers up for a rescue and writes
        "srun: error: n2: task 1: Exited with exit code 1" at once); the new whole lines of
        its log are read on each call."""
        if self._logged is not None or self.log is None:  # set for srun only (`start`)
            return self._logged
        try:
            with open(self.log, "rb") as f:
                f.seek(self._log_offset)
                chunk = f.read()
        except OSError:
            return None
        whole = chunk[:chunk.rfind(b"\n") + 1]
        self._log_offset += len(whole)
        found = _launcher_failures(whole.decode(errors="replace"))
        if found:
            _, rank, code, node = min(found)
            self._logged = Failure(rank, code, node, now)
        return self._logged

    def signal(self, sig: int) -> None:
        self.stopped_at = self.stopped_at or time.time()
        self.notify(sig)

    def notify(self, sig: int) -> None:
        """Send `sig` to every process group still running, without stopping the launch."""
        for i, (_, _, p) in enumerate(self.procs):
            if i not in self.exits:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass

    def stop(self, now: Callable[[], float], second_term_s: float | None = None) -> None:
        """SIGTERM every process group (again after `second_term_s`, if given), then SIGKILL
        whatever is left after TERM_GRACE_S."""
        self.signal(signal.SIGTERM)
        start = now()
        again = None if second_term_s is None else start + second_term_s
        while not self.done and now() < start + TERM_GRACE_S:
            time.sleep(0.1)
            self.poll(now())
            if again is not None and now() >= again and not self.done:
                self.notify(signal.SIGTERM)
                again = None
        for _, _, p in self.procs:  # SIGKILL the groups even if the leader exited: no stragglers
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for _, _, p in self.procs:
            p.wait()
        self.poll(now())

    def wait(self, timeout: float) -> None:
        """Wait up to `timeout` for the launch to exit by itself; stop it after that."""
        end = time.time() + timeout
        while not self.done and time.time() < end:
            time.sleep(0.1)
            self.poll(time.time())
        if not self.done:
            self.stop(time.time)


def start(request: AttemptRequest, plan: LaunchPlan) -> tuple[_Launch, list[str]]:
    """Start the launch: the request's launch `plan`, with its launcher. Returns the launch and
    the command (argv; `(local)` + argv for per-rank processes)."""
    from campaign.executors import launchers

    run_dir = Path(request.run_dir)
    if plan.taskfile is not None:  # srun's SLURM_HOSTFILE: rank r on active[r // ranks_per_node]
        Path(plan.taskfile).write_text("".join(f"{h}\n" for h in plan.rank_hosts))
    base_env = {**os.environ, **warm.launch_environment(), **dict(plan.env)}
    if request.launcher == "local":
        procs = _start_ranks(run_dir, plan, base_env)
        command = ["(local)", *plan.argv]
    else:
        command = launchers.build_command(request.launcher, plan)
        with open(rundir.launcher_log(run_dir), "wb") as log:
            p = subprocess.Popen(command, env=base_env, stdout=log, stderr=subprocess.STDOUT, cwd=run_dir,
                                 start_new_session=True)
        procs = [(-1, "", p)]
    block_job = os.environ.get("PBS_JOBID") or os.environ.get("SLURM_JOB_ID")
    report.write_json_atomic(run_dir / PIDS_FILE, {"host": socket.gethostname(), "pgids": [p.pid for _, _, p in procs],
                                                   "launcher": request.launcher, "block_job_id": block_job,
                                                   "attempt": request.attempt})
    # srun alone keeps a failed task's peers running (contract.LINGER_LAUNCHERS): its log is read as it grows.
    log = rundir.launcher_log(run_dir) if request.launcher == "srun" else None
    return _Launch(procs, log=log), command


def _start_ranks(run_dir: Path, plan: LaunchPlan,
                 base_env: dict[str, str]) -> list[tuple[int, str, subprocess.Popen[bytes]]]:
    """One process per rank (the local launcher), each logging to its own file."""
    from campaign.executors import launchers

    procs = []
    try:
        for rank, (rank_argv, env) in enumerate(launchers.local_rank_processes(plan)):
            with open(rundir.rank_log(run_dir, rank), "wb") as log:
                pid_env = {rundir.RANK_PID_ENV: str(rundir.rank_pid_file(run_dir, rank))}  # a warm client's child
                p = subprocess.Popen(rank_argv, env={**base_env, **env, **pid_env}, stdout=log,
                                     stderr=subprocess.STDOUT, cwd=run_dir, start_new_session=True)
            procs.append((rank, env.get("CAMPAIGN_NODE", ""), p))
    except OSError:  # the ranks already started must not train on unwatched
        for _, _, p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        raise
    return procs


def free_port() -> int:
    """A TCP port free on this host now (for a launch's rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# What launchers print when a rank fails first (the evidence `srun`/`mpiexec` leave us):
_LAUNCHER_FAILURES = (
    # srun: error: n2: task 1: Exited with exit code 1   |   srun: error: n2: task 3: Killed
    re.compile(r"srun: error: (?P<node>[\w.-]+): tasks? (?P<rank>\d+)[\d,-]*: "
               r"(?:Exited with exit code (?P<code>\d+)|(?P<signal>Killed|Segmentation fault|Aborted))"),
    # PALS: x4000c0s0b0n0: rank 5 exited with code 1   |   ... rank 5 died from signal 9
    re.compile(r"(?P<node>[\w.-]+): rank (?P<rank>\d+) (?:exited with code (?P<code>\d+)|died from signal (?P<sig>\d+))"),
    # MPICH hydra: RANK 1 PID 1234 RUNNING AT b ... EXIT CODE: 1
    re.compile(r"RANK (?P<rank>\d+) PID \d+ RUNNING AT (?P<node>[\w.-]+)\s+=\s+KILLED BY SIGNAL: (?P<sig>\d+)|"
               r"PID \d+ RUNNING AT (?P<node2>[\w.-]+)\s+=\s+EXIT CODE: (?P<code2>\d+)"),
)
_SIGNALS = {"Killed": 137, "Segmentation fault": 139, "Aborted": 134}


def launcher_failure(log: Path, failure: Failure) -> Failure:
    """The first failed rank as the launcher reported it (`failure` when its log names none)."""
    try:
        found = _launcher_failures(log.read_text(errors="replace"))
    except OSError:
        return failure
    if not found:
        return failure
    _, rank, code, node = min(found)
    return Failure(rank, code, node, failure.seen)


def _launcher_failures(text: str) -> list[tuple[int, int, int, str]]:
    """(position, rank, exit code, node) of each rank failure a launcher's output reports."""
    found = []
    for pattern in _LAUNCHER_FAILURES:
        for m in pattern.finditer(text):
            d = {k: v for k, v in m.groupdict().items() if v is not None}
            code = int(d.get("code") or d.get("code2") or 0) or _SIGNALS.get(d.get("signal", ""), 0) \
                or 128 + int(d.get("sig") or 0)
            if code in (0, 128, exits.SIGTERM):  # ranks terminated because another failed first
                continue
            found.append((m.start(), int(d.get("rank", -1)), code, d.get("node") or d.get("node2") or ""))
    return found


def _norm(code: int) -> int:
    return 128 - code if code < 0 else code  # Popen: -N means killed by signal N
