"""The supervisor: the Parsl app that runs one attempt next to the launch.

It runs on the allocation's head node (locally for the `local` site). It reads the block's
node list (`PBS_NODEFILE`, `SLURM_JOB_NODELIST`, or the virtual nodes of the local site),
drops the nodes the ledger excludes, takes the active nodes, writes the hostfile, launches
the trainer with the site's launcher, and watches it:

- the stall watchdog (`campaign.watchdog`) reads metrics, events and heartbeats; on a stall
  it names the culprit nodes, then SIGTERMs the launch and SIGKILLs it after a grace period
  (exit 124, class `stalled`); past the attempt's hard timeout (the stage's `timeout_s`) it
  does the same, class `timed_out` (its reason says the timeout, the step and how long since
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
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from campaign import contract, evidence, exits, guard, names, report, rundir, watchdog
from campaign.attempt import LAUNCH_FAILED, AttemptReport, AttemptRequest, Interrupt
from campaign.executors import warm
from campaign.rundir import PIDS_FILE, STOP_FILE
from campaign.train import rescue

POLL_S = 0.25
"""How often the supervisor looks at the launch; cheap (a few small reads)."""
FAILED_RANK_GRACE_S = 10.0
"""After one rank failed, how long the others get to exit by themselves."""
TERM_GRACE_S = 5.0
"""Between SIGTERM and SIGKILL when the supervisor stops a launch."""
RESCUE_WAIT_S = 60.0
"""How long a rescue save may take before any checkpoint's time was measured."""
NOT_FAULTS = frozenset({exits.SIGTERM, exits.NONFINITE, exits.NO_RETRY, exits.BROKEN_ENV})
"""Exits after which no rescue is asked for: the deadline (the trainer checkpointed), a
diverged or misconfigured run, an environment that cannot train."""


class Failure(NamedTuple):
    """The first rank of a launch that exited non-zero."""

    rank: int
    """-1 while only the launcher process (mpiexec, srun) is known to have failed: its log names the rank."""
    exit_code: int
    node: str
    seen: float
    """When the supervisor saw the exit (time.time())."""


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
        if self._logged is not None or self.log is None:  # set for srun only (`_start`)
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

    def stop(self, now: Callable[[], float]) -> None:
        """SIGTERM every process group, then SIGKILL whatever is left after a grace period."""
        self.signal(signal.SIGTERM)
        deadline = now() + TERM_GRACE_S
        while not self.done and now() < deadline:
            time.sleep(0.1)
            self.poll(now())
        for _, _, p in self.procs:  # SIGKILL the groups even if the leader exited: no stragglers
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for _, _, p in self.procs:
            p.wait()
        self.poll(now())


def supervise(request: AttemptRequest) -> dict[str, Any]:
    """Run one attempt described by `request` (`campaign.attempt.build_request`)."""
    run_dir = Path(request.run_dir)
    (run_dir / rundir.LOGS_DIR).mkdir(parents=True, exist_ok=True)
    start = time.time()
    try:
        allocation = list(request.allocation or block_nodes())
    except ValueError as e:  # the scheduler named a node no launcher can take
        out = AttemptReport(exit_code=exits.NO_RETRY, exit_class="config_error", duration_s=0.0, nodes=[], error=str(e))
        return _finish(run_dir, out)
    excluded = set(request.exclude)
    usable = [h for h in allocation if h not in excluded]
    n = request.nodes
    if len(usable) < n:
        msg = (f"the stage asks for {n} active node(s), but the block has {len(usable)} usable of {len(allocation)} "
               f"({len(allocation) - len(usable)} excluded); ask for fewer nodes, more spares, or lift exclusions "
               "with `campaign nodes include`")
        out = AttemptReport(exit_code=exits.NO_RETRY, exit_class="config_error", duration_s=0.0, nodes=[],
                            allocation=allocation, error=msg, short_of_nodes=True)
        return _finish(run_dir, out)
    active, spares = usable[:n], usable[n:]
    if request.rotate:
        active = active[request.rotate % n:] + active[:request.rotate % n]
    _prepare(request, run_dir, active)
    # Say a launch may start before looking for STOP: a driver that writes STOP and then finds
    # no pids.json knows no launch will start (campaign.recovery.stop_orphan).
    report.write_json_atomic(run_dir / PIDS_FILE, {"host": socket.gethostname(), "pgids": [], "starting": True,
                                                   "block_job_id": os.environ.get("PBS_JOBID")
                                                   or os.environ.get("SLURM_JOB_ID"), "attempt": request.attempt})
    if (run_dir / STOP_FILE).exists():
        out = AttemptReport(exit_code=exits.SIGTERM, exit_class="cancelled", duration_s=0.0, nodes=active,
                            allocation=allocation, spares=spares, killed_by="stop",
                            error="stopped before the launch started (STOP)")
        return _finish(run_dir, out)
    try:
        launch, command, text = _start(request, active)
    except OSError as e:  # the launcher or the trainer's program cannot be executed: no rank ever ran
        out = AttemptReport(exit_code=exits.BROKEN_ENV, exit_class="crashed_systemic", duration_s=time.time() - start,
                            nodes=active, allocation=allocation, error=f"{LAUNCH_FAILED}: {e}")
        return _finish(run_dir, out)
    guard.start(run_dir, [p.pid for _, _, p in launch.procs])  # STOP is honoured even once this supervisor is gone
    adapter = ProgressAdapter.for_request(request)
    watched = _watch(launch, request, active, start, adapter)
    if adapter is not None:  # what rank 0 printed just before it exited
        adapter.poll(time.time())
        if request.checkpoint_layout is not None:
            _note_checkpoints(request, adapter, [], start)
    failure = launch.first_failure() or launch.logged_failure(time.time())
    if failure is not None and failure.rank == -1:  # one launcher process: its log names the rank
        failure = launcher_failure(rundir.launcher_log(run_dir), failure)
    metrics, _ = report.read_metrics(run_dir, chain=_chain(request), final=True)
    finding = None
    if watched.killed_by is None and failure is not None:  # a crash: what does the evidence say?
        finding = evidence.assess(_rank_exits(launch, run_dir, failure, watched.rescue), first_step=bool(metrics),
                                  nodes=active, same_poll_s=1.0)
        if finding.primary:
            failure = Failure(finding.primary["rank"], finding.primary["exit_code"], finding.primary["node"],
                              failure.seen)
    code = exits.STALLED if watched.killed_by in ("stalled", "timeout") else (failure.exit_code if failure else 0)
    if watched.killed_by == "exit_hung":  # the trainer's own last event says how it ended
        code = {"done": exits.OK, "deadline": exits.SIGTERM, "nonfinite_loss": exits.NONFINITE}.get(
            watched.final_event or "", exits.STALLED)
    policy = request.watchdog
    beats = report.read_heartbeats(run_dir)
    for node in active:  # what a killed launch left on node-local storage (this host's nodes only)
        report.remove_node_local(run_dir, node, str(request.attempt))
    # A rank that failed by itself may be evidence (the finding says); ranks the supervisor stopped are not.
    suspects = watched.suspects if watched.killed_by else [s.to_dict() for s in finding.suspects] if finding else []
    stall = watched.stall
    if watched.killed_by == "stalled" and not suspects and len(active) > 1 and policy.drill_s > 0:
        drill_log: list[dict[str, Any]] = []
        suspects = [{"node": n, "reason": "hung in a collective drill when bisecting the allocation",
                     "evidence": {"drills": drills}} for n, drills in _bisect(request, active, policy, drill_log)]
        stall = f"{stall}; {drill_summary(drill_log, suspects, policy.drill_s)}"
    if watched.killed_by in ("stalled", "timeout") and adapter is not None:
        stall = f"{stall}; {STDOUT_EVIDENCE}"
    if watched.killed_by in ("stop", "interrupt"):
        exit_class = "cancelled"
    elif watched.killed_by == "rundir_lost":
        exit_class = "orphaned"  # nothing the trainer or a node did: resumable
    elif watched.killed_by == "timeout":
        exit_class = "timed_out"
    elif finding is not None:
        exit_class = exits.classify_finding(code, finding.kind)
    else:
        exit_class = exits.classify(code, suspects=bool(suspects))
    out = AttemptReport(
        exit_code=code, exit_class=exit_class, duration_s=round(time.time() - start, 3), nodes=active,
        allocation=allocation, spares=spares, killed_by=watched.killed_by, stall=stall,
        first_failure=None if failure is None else {"rank": failure.rank, "exit_code": failure.exit_code,
                                                      "node": failure.node, "after_s": round(failure.seen - start, 3)},
        suspects=suspects, last_step=metrics[-1]["step"] if metrics else None, launch_command=command,
        launch_text=text,
        detected_after_s=watched.detected_after_s, stragglers=watchdog.stragglers(beats, policy.straggler_ratio),
        finding=finding.to_dict() if finding else None, error=finding.message if finding and code else None,
        rescue=watched.rescue,
    )
    return _finish(run_dir, out)


def _finish(run_dir: Path, out: AttemptReport) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)  # deleted under the attempt: the report still reaches the driver
    report.write_json_atomic(run_dir / rundir.SUPERVISOR_REPORT, out.to_dict())
    return out.to_dict()


def block_nodes() -> list[str]:
    """The nodes of the block this worker runs in, in the scheduler's order, one per line of
    its node file. A line that is not a node name (`names.node_problem`: a control
    character, a space) is a ValueError naming the file and the line."""
    nodefile = os.environ.get("PBS_NODEFILE")
    if nodefile and Path(nodefile).exists():
        return _node_lines(Path(nodefile).read_text(errors="replace"), f"PBS_NODEFILE {nodefile}")
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if nodelist:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
        return _node_lines(out.stdout, f"`scontrol show hostnames {nodelist!r}`")
    return [socket.gethostname()]


def _node_lines(text: str, source: str) -> list[str]:
    seen: dict[str, None] = {}
    for number, line in enumerate(text.split("\n"), 1):  # not splitlines(): it splits at \x1c, \x85 too
        node = line.strip()
        if not node:
            continue
        why = names.node_problem(node)
        if why is not None:
            raise ValueError(f"{source}, line {number}: {node!r} {why}; the scheduler's node list is not usable")
        seen.setdefault(node, None)
    return list(seen)


def _prepare(request: AttemptRequest, run_dir: Path, active: list[str]) -> None:
    """Hostfile of the active nodes; the block's deadline into the trainer's config."""
    request.hostfile.write_text("".join(f"{h}\n" for h in active))
    walltime = request.block_walltime_s
    if walltime:
        config_path = request.config_path
        cfg = json.loads(config_path.read_text())
        started = time.time() if request.deadline_from == "attempt" else _block_started()
        cfg["run"]["deadline_unix"] = started + float(walltime)
        report.write_json_atomic(config_path, cfg)


def _block_started() -> float:
    """When this block's job started: the Parsl worker pool is the block's first process."""
    try:
        import psutil

        return float(psutil.Process(os.getppid()).create_time())
    except Exception:  # no psutil or no parent: the attempt's start is a safe lower bound
        return time.time()


def _start(request: AttemptRequest, active: list[str]) -> tuple[_Launch, list[str], str]:
    """Start the launch: the request's launch plan on `active`, with its launcher. Returns the
    launch, the command (argv; `(local)` + argv for per-rank processes) and its text as the
    dry run renders it."""
    from campaign.executors import launchers

    run_dir = Path(request.run_dir)
    plan = request.launch_plan(active)
    if plan.taskfile is not None:  # srun's SLURM_HOSTFILE: rank r on active[r // ranks_per_node]
        Path(plan.taskfile).write_text("".join(f"{h}\n" for h in plan.rank_hosts))
    base_env = {**os.environ, **warm.launch_environment(), **dict(plan.env)}
    if request.launcher == "local":
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
    return _Launch(procs, log=log), command, launchers.render(request.launcher, plan)


@dataclass
class _WatchOutcome:
    killed_by: str | None = None
    final_event: str | None = None
    stall: str | None = None
    suspects: list[dict[str, Any]] = field(default_factory=list)
    detected_after_s: float | None = None
    rescue: dict[str, Any] | None = None


@dataclass
class ProgressAdapter:
    """`trainer.progress: stdout`: reads rank 0's output (its log, or the launcher's) from a
    byte offset with `trainer.step_pattern` and appends the rows to metrics.jsonl, so the
    watchdog, the driver's ingestion and the stages read an unmodified trainer's steps as
    they read metrics.jsonl. Without a `tokens` group the tokens are the step times the spec's
    batch (`tokens_per_step`), or 0 where the spec gives none; without `step_time`, the step
    time is the time between two matched lines over the steps between them."""

    log: Path
    run_dir: Path
    pattern: re.Pattern[str]
    offset: int = 0
    last: tuple[int, float] | None = None
    shift: int = 0
    """Added to every printed step: 1 for a trainer that counts from 0 (`trainer.first_step: 0`)."""
    tokens_per_step: int | None = None
    """Cumulative tokens of step N are N x this when the pattern reads none (None: 0)."""
    seen: list[tuple[int, float, float]] = field(default_factory=list)
    """(step, earliest, latest): each step with the poll before the one that read its line
    and that poll (when it can have been printed); the step of a checkpoint saved in between."""
    previous_poll: float = 0.0

    @classmethod
    def for_request(cls, request: AttemptRequest) -> ProgressAdapter | None:
        if request.progress_pattern is None:
            return None
        run_dir = Path(request.run_dir)
        log = rundir.rank_log(run_dir, 0) if request.launcher == "local" else rundir.launcher_log(run_dir)
        return cls(log, run_dir, re.compile(request.progress_pattern), shift=1 - request.progress_first_step,
                   tokens_per_step=request.progress_tokens_per_step)

    def poll(self, now: float) -> None:
        rows, self.offset = report.read_progress_lines(self.log, self.pattern, self.offset)
        earliest, self.previous_poll = self.previous_poll, now
        if not rows:
            return
        for row in rows:
            row["step"] += self.shift
        self.seen += printed_between(rows, earliest, now)
        del self.seen[:-SEEN_KEPT]
        # Lines read in one poll share its time: spread the time since the last poll over their steps.
        per_step = None
        if self.last is not None and rows[-1]["step"] > self.last[0]:
            per_step = round((now - self.last[1]) / (rows[-1]["step"] - self.last[0]), 6)
        for row in rows:
            row.setdefault("tokens", row["step"] * self.tokens_per_step if self.tokens_per_step else 0)
            if "step_time_s" not in row and per_step is not None:
                row["step_time_s"] = per_step
            row["time"] = now
        self.last = (rows[-1]["step"], now)
        report.append_metrics(self.run_dir, rows)


def _read_rank_finished(launch: _Launch, request: AttemptRequest, watch: watchdog.Watch,
                        chain: report.StepChain | None = None) -> bool:
    """With `progress: stdout`: has the rank whose output is read (rank 0; the launcher's with
    mpiexec/srun) exited 0 after reporting the attempt's last step? (Its last row may still be
    held by the `chain`, waiting for a row that will not come: its output is complete.)"""
    target = _max_step(request)
    for i, (rank, _, _) in enumerate(launch.procs):
        if rank == 0 and i in launch.exits:
            reached = max(watch.last_step, chain.tip if chain is not None else -1)
            return launch.exits[i][0] == 0 and reached >= target
    return False


def _note_checkpoints(request: AttemptRequest, adapter: ProgressAdapter | None, seen: list[tuple[int, float, float]],
                      start: float) -> None:
    """The step of each of the trainer's own checkpoints whose name gives none, from the steps
    reported around its save (`contract.note_checkpoint_steps`)."""
    env = request.env
    every = int(env.get("CAMPAIGN_CHECKPOINT_EVERY") or 0)
    at = tuple(int(x) for x in (env.get("CAMPAIGN_CHECKPOINT_AT") or "").split(",") if x)
    contract.note_checkpoint_steps(request.checkpoint_layout, env["CAMPAIGN_CHECKPOINT_DIR"],
                                   adapter.seen if adapter is not None else seen, since=start,
                                   expected=contract.expected_saves(every, at))


def printed_between(rows: list[dict[str, Any]], earliest: float, latest: float) -> list[tuple[int, float, float]]:
    """(step, earliest, latest) print times of the rows one poll read, all printed between the
    previous poll (`earliest`) and this one (`latest`); where the trainer gave its step time,
    consecutive lines are at least that far apart, which narrows both ends."""
    given = [r.get("step_time_s") or 0.0 for r in rows]
    lo, hi = [earliest] * len(rows), [latest] * len(rows)
    for i in range(1, len(rows)):
        lo[i] = min(lo[i - 1] + given[i], latest)
    for i in range(len(rows) - 2, -1, -1):
        hi[i] = max(hi[i + 1] - given[i + 1], earliest)
    return [(int(r["step"]), min(a, b), b) for r, a, b in zip(rows, lo, hi)]


def _checkpoint_ready(interrupt: Interrupt, request: AttemptRequest, start: float) -> bool:
    if request.checkpoint_layout is not None and interrupt.checkpoint_step is not None:
        return contract.checkpoint_since(request.checkpoint_layout, request.env["CAMPAIGN_CHECKPOINT_DIR"],
                                         interrupt.checkpoint_step, start) is not None
    path = interrupt.after_checkpoint
    return path is None or (Path(path) / report.COMPLETE_MARKER).exists()



def _watch(launch: _Launch, request: AttemptRequest, active: list[str], start: float,
           adapter: ProgressAdapter | None = None) -> _WatchOutcome:
    """Wait for the launch; stop it on a stall, a failed rank, the hard timeout, STOP or an interrupt."""
    run_dir = Path(request.run_dir)
    policy = request.watchdog
    watch = watchdog.Watch(started=start, prior_step_times=list(request.measured_step_s))
    interrupt = request.interrupt
    timeout = request.timeout_s
    offsets = {"metrics": 0, "events": 0}
    chain = _chain(request)
    rescued: dict[str, Any] | None = None
    seen: list[tuple[int, float, float]] = []  # a trainer's own metrics rows: (step, time, time)
    folder = _identity(run_dir)
    while True:
        now = time.time()
        launch.poll(now)
        if _identity(run_dir) != folder:  # deleted under the launch: its rows and heartbeats go nowhere now
            (run_dir / rundir.LOGS_DIR).mkdir(parents=True, exist_ok=True)
            # SIGKILL, not SIGTERM: a save on SIGTERM would put steps whose rows went with the folder
            # behind the relaunch's checkpoint; from the last periodic one, the relaunch records them again.
            launch.signal(signal.SIGKILL)
            _wait(launch, timeout=10.0)
            return _WatchOutcome(killed_by="rundir_lost", stall=f"the run directory {run_dir} was deleted under the "
                                 "launch: made it again and killed the launch; the relaunch resumes from the newest "
                                 "complete checkpoint")
        if launch.done:
            return _WatchOutcome(killed_by="interrupt" if interrupt and watch.last_step >= interrupt.after_step
                                 else None, rescue=rescued)
        if adapter is not None:
            adapter.poll(now)
        rows = _observe(run_dir, watch, offsets, now, chain)
        if adapter is not None and watch.final_event is None and _read_rank_finished(launch, request, watch, chain):
            # Rank 0 exited 0 after its last step: the training outcome is known; ranks whose
            # output is not read get exit_s to follow, then are stopped (exit_hung), not relaunched.
            watch.saw_events([{"event": "done", "step": watch.last_step}], now)
        if adapter is None:
            seen += [(int(r["step"]), r["time"], r["time"]) for r in rows if r.get("time") is not None]
            del seen[:-SEEN_KEPT]
        if request.checkpoint_layout is not None:
            _note_checkpoints(request, adapter, seen, start)
        if (run_dir / STOP_FILE).exists():
            launch.stop(time.time)
            return _WatchOutcome(killed_by="stop")
        if interrupt and watch.last_step >= interrupt.after_step and _checkpoint_ready(interrupt, request, start):
            launch.signal(getattr(signal, interrupt.signal))
            _wait(launch, timeout=30.0)
            return _WatchOutcome(killed_by="interrupt")
        if interrupt and interrupt.give_up_step and watch.last_step >= interrupt.give_up_step:
            launch.stop(time.time)
            return _WatchOutcome(killed_by="interrupt", stall=f"no complete checkpoint of step "
                                 f"{interrupt.checkpoint_step} or later by step {watch.last_step}")
        logged = launch.logged_failure(now)
        failure = launch.first_failure() or logged
        if failure is not None and watch.rescue and rescued is None and failure.exit_code not in NOT_FAULTS:
            # A rank died: the survivors linger (their collective failed) for the rescue request.
            rank, _, node, _ = launcher_failure(rundir.launcher_log(run_dir), failure) if failure.rank == -1 \
                else failure
            rescued = _rescue(launch, request, active, watch, report.read_heartbeats(run_dir), avoid_nodes={node},
                              avoid_ranks={rank})
        # The launcher's log line is the evidence: nothing more to wait for once the rescue (if
        # any) is over. Ranks of their own get a grace to report their own failure.
        if failure is not None and (failure is logged or now - failure.seen > FAILED_RANK_GRACE_S):
            launch.stop(time.time)
            return _WatchOutcome(killed_by=None, rescue=rescued)  # the failed rank's exit is the evidence
        decision = watchdog.decide(watch, policy, now)
        early = watchdog.early_budget(watch, policy)
        if not decision.stalled and early is not None and now - watch.last_progress > early and failure is None:
            # Silent for longer than the confirmed budget: do the heartbeats show who hangs?
            beats = report.read_heartbeats(run_dir)
            found = watchdog.culprits(beats, active, now, policy) if beats else []
            if watchdog.stall_pattern(found, watch, policy):
                decision = watchdog.decide(watch, policy, now, confirmed="compute")
            elif watchdog.collective_hang(beats, active, watch, policy):
                decision = watchdog.decide(watch, policy, now, confirmed="collective")
        if decision.stalled and decision.phase == "exiting":
            # Every rank finished but the launch does not exit (e.g. srun waiting on a lost
            # socket): the training outcome is known; stop the launcher, do not call it a stall.
            left = [r for i, (r, _, _) in enumerate(launch.procs) if i not in launch.exits and r >= 0]
            launch.stop(time.time)
            what = (f"rank(s) {left} did not exit {decision.idle_s:.0f} s after rank 0 reported its last step "
                    f"({watch.last_step}) and exited 0 (their output is not read: progress: stdout reads rank 0's); "
                    "stopped them" if adapter is not None and left else
                    f"the launch did not exit {decision.idle_s:.0f} s after the trainer finished; stopped it")
            return _WatchOutcome(killed_by="exit_hung", final_event=watch.final_event, stall=what)
        if failure is None and (decision.stalled or now - start > timeout):
            reason = (decision.reason if decision.stalled else
                      f"hard timeout of {timeout:g} s (the stage's timeout_s) at step {watch.last_step or 'none'}, "
                      f"{now - watch.last_progress:.0f} s after the last progress")
            beats = report.read_heartbeats(run_dir)
            # A trainer read through its output (progress: stdout) writes no heartbeats: their absence is no evidence.
            suspects = watchdog.culprits(beats, active, now, policy) if beats or adapter is None else []
            detected = now - watch.last_progress
            if watch.rescue:
                rescued = _rescue(launch, request, active, watch, beats, avoid_nodes={s["node"] for s in suspects},
                                  avoid_ranks={s["evidence"].get("rank") for s in suspects})
            launch.stop(time.time)
            return _WatchOutcome(killed_by="stalled" if decision.stalled else "timeout", stall=reason, suspects=suspects,
                                 detected_after_s=round(detected, 2), rescue=rescued)
        time.sleep(POLL_S)


def _rescue(launch: _Launch, request: AttemptRequest, active: list[str], watch: watchdog.Watch,
            beats: dict[str, dict[str, Any]], *,
            avoid_nodes: set[str], avoid_ranks: set[Any]) -> dict[str, Any]:
    """Ask one replica on a healthy node to save a rescue checkpoint (campaign.train.rescue):
    write the request, SIGUSR1 the launch, wait for `rescue.json` (bounded by the checkpoint
    budget). Every rank reads the request; the others, lingering after a lost peer, exit.
    `beats`: the heartbeats as just read (they say where each rank runs)."""
    run_dir = Path(request.run_dir)
    rank = _rescuer(launch, request, active, avoid_nodes, avoid_ranks, watchdog.rank_nodes(beats))
    t0 = time.time()
    report.write_json_atomic(run_dir / rescue.REQUEST_FILE, {"rank": rank})
    launch.notify(signal.SIGUSR1)
    if rank < 0:
        return {"saved": False, "why": "no surviving rank outside the suspect nodes"}
    budget = watchdog.checkpoint_budget(watch, request.watchdog, unmeasured=RESCUE_WAIT_S)
    result = run_dir / rescue.RESULT_FILE
    while time.time() - t0 < budget and not result.exists():
        time.sleep(0.05)
        launch.poll(time.time())
        if launch.done:
            break
    try:
        out = json.loads(result.read_text())
    except (OSError, ValueError):
        out = {"rank": rank, "saved": False, "why": f"rank {rank} did not answer within {budget:.0f} s"}
    return {**out, "rank": rank, "asked_at": t0, "waited_s": round(time.time() - t0, 3)}


def _rescuer(launch: _Launch, request: AttemptRequest, active: list[str], avoid_nodes: set[str],
             avoid_ranks: set[Any], placed: dict[int, str] | None = None) -> int:
    """The lowest rank still running on a node not under suspicion, or -1. Where a rank runs:
    its own process (local launcher), else the node its heartbeat comes from (`placed`:
    `watchdog.rank_nodes`), else the launch order, which srun does not keep: seen in the
    goodput benchmark, a hang on n3 (active [n3, n1]) left no rescuer, both ranks taken for n3's."""
    local = {rank: (node, i) for i, (rank, node, _) in enumerate(launch.procs) if rank >= 0}
    placed = placed or {}
    for rank in range(len(active) * request.ranks_per_node):
        node, i = local.get(rank, (placed.get(rank, active[rank // request.ranks_per_node]), None))
        if node in avoid_nodes or rank in avoid_ranks or (i is not None and i in launch.exits):
            continue
        return rank
    return -1


def _max_step(request: AttemptRequest) -> int:
    """The attempt's last step as metrics.jsonl numbers it: a row past it is not progress.
    CAMPAIGN_MAX_STEPS is in the trainer's own numbering (`trainer.first_step`: a trainer
    counting from 0 is told one less), the rows in the ledger's (from 1)."""
    try:
        last = int(request.env.get("CAMPAIGN_MAX_STEPS", "")) + 1 - request.progress_first_step
    except ValueError:
        return report.STEP_MAX
    return min(last, report.STEP_MAX)


def _chain(request: AttemptRequest) -> report.StepChain:
    """The attempt's metrics rows as its trainer can have written them: after the checkpoint it
    resumes from, up to its last step."""
    return report.StepChain(max_step=_max_step(request), start=request.resume_step or 0)


def _observe(run_dir: Path, watch: watchdog.Watch, offsets: dict[str, int], now: float,
             chain: report.StepChain) -> list[dict[str, Any]]:
    """Feed the watch what the run directory holds that is new (valid rows and events only: a
    bad line is skipped, the driver counts it; rows as the attempt's `chain` accepts them, so a
    forged row ahead never hides the real steps after it) and the heartbeats; the new metrics rows."""
    rows, offsets["metrics"] = report.read_metrics(run_dir, offsets["metrics"], chain=chain)
    watch.saw_steps(rows, now)
    events, offsets["events"] = report.read_events_from(run_dir, offsets["events"])
    watch.saw_events(events, now)
    beats = report.read_heartbeats(run_dir)
    phases = {r.get("phase") for b in beats.values() for r in b.get("ranks", {}).values()}
    watch.saw_phases({p for p in phases if p}, now)
    watch.saw_compute(beats)
    return rows


def _identity(folder: Path) -> tuple[int, int] | None:
    """(device, inode) of `folder`, None when it is gone: a folder deleted and made again differs."""
    try:
        st = folder.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _wait(launch: _Launch, timeout: float) -> None:
    end = time.time() + timeout
    while not launch.done and time.time() < end:
        time.sleep(0.1)
        launch.poll(time.time())
    if not launch.done:
        launch.stop(time.time)


SEEN_KEPT = 10_000
"""Reported steps kept to date a checkpoint's save (`contract.step_at_save`): far more than a
checkpoint interval's worth at any poll rate, and a bounded list in a run of a million steps."""

STDOUT_EVIDENCE = ("evidence: rank 0's output only (progress: stdout; no heartbeats, so no rank or phase is "
                   "named): its last step line and its log")
"""What a stall of a trainer read through its output can be judged on (docs/trainer-contract.md)."""


def drill_summary(log: list[dict[str, Any]], suspects: list[dict[str, Any]], drill_s: float) -> str:
    """The bisection drill's result in words: which subsets passed, and what it blamed."""
    runs = ", ".join(f"{'+'.join(d['nodes'])} {'passed' if d['ok'] else 'hung'}" for d in log)
    if suspects:
        return f"collective drill ({drill_s:g} s each): {runs}; suspects: {', '.join(s['node'] for s in suspects)}"
    return (f"collective drill ({drill_s:g} s each): {runs}; no node hangs it: the hang is the trainer's, not a "
            "node's or the network's")


def _bisect(request: AttemptRequest, active: list[str], policy: watchdog.WatchdogPolicy,
            log: list[dict[str, Any]] | None = None) -> list[tuple[str, list[dict[str, Any]]]]:
    """Nodes whose subset hangs a short collective drill, found by halving (instead of blind
    rotation). The two halves are disjoint node sets, so their drills run at once: a round
    costs one drill's time, not two. A single-rank subset tests the node's own stack, not its
    network."""
    log = [] if log is None else log
    if len(active) < 2:
        return []
    half = len(active) // 2
    parts = [active[:half], active[half:]]
    results = _drills(request, parts, policy)
    log.extend({"nodes": part, "ok": ok} for part, ok in zip(parts, results))
    bad: list[tuple[str, list[dict[str, Any]]]] = []
    for part, ok in zip(parts, results):
        if not ok:
            bad += [(part[0], list(log))] if len(part) == 1 else _bisect(request, part, policy, log)
    return bad


def _drills(request: AttemptRequest, parts: list[list[str]], policy: watchdog.WatchdogPolicy) -> list[bool]:
    """Run `campaign.train.drill` on each node set of `parts` at the same time, each with the
    attempt's launch plan on its own port; True for each that passed within drill_s."""
    launches = []
    for part in parts:
        drill_dir = rundir.drill_dir(Path(request.run_dir), part)
        (drill_dir / rundir.LOGS_DIR).mkdir(parents=True, exist_ok=True)
        sub = request.for_drill(drill_dir, free_port())
        sub.hostfile.write_text("".join(f"{h}\n" for h in part))
        launches.append(_start(sub, part)[0])
    end = time.time() + policy.drill_s
    while not all(launch.done for launch in launches) and time.time() < end:
        time.sleep(0.2)
        for launch in launches:
            launch.poll(time.time())
    passed = [launch.done and all(code == 0 for code, _ in launch.exits.values()) for launch in launches]
    for launch in launches:
        if not launch.done:
            launch.stop(time.time)
    return passed


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


def _rank_exits(launch: _Launch, run_dir: Path, failure: Failure,
                rescue_asked: dict[str, Any] | None = None) -> list[evidence.RankExit]:
    """The evidence of a crash: every rank's exit with the tail of its log (local launcher),
    or the failed rank the launcher named with its lines of the launcher's log. The rescuer's
    exit after it was asked to save is no evidence against its node (it is counted as
    stopped): it worked on after its peer failed, and whatever killed it mid-save, its node
    did not fail the launch."""
    stopped = launch.stopped_at
    rescuer = (rescue_asked or {}).get("rank")
    asked_at = float((rescue_asked or {}).get("asked_at") or math.inf)
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
            out.append(evidence.RankExit.from_popen(rank, node, code, seen, log_path=str(log),
                                                    log_tail=evidence.read_tail(log),
                                                    stopped=(stopped is not None and seen >= stopped)
                                                    or (rank == rescuer and seen >= asked_at)))
    return out


def _norm(code: int) -> int:
    return 128 - code if code < 0 else code  # Popen: -N means killed by signal N
