"""The supervisor: the Parsl app that runs one attempt next to the job.

It runs on the allocation's head node (locally for the `local` site), launches the
trainer's ranks with the site's launcher, watches them, kills the job on a hard timeout
(exit 124) or when one rank failed and the others linger, and returns a plain dict
(`AttemptReport`) that survives Parsl's serialization. It never touches the ledger: the
orchestrator ingests `metrics.jsonl` and the report.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from campaign import exits, report

POLL_S = 0.25
"""How often the supervisor looks at the ranks; cheap (a few stat calls)."""
FAILED_RANK_GRACE_S = 10.0
"""After one rank failed, how long the others get to notice before they are killed."""
TERM_GRACE_S = 5.0
"""Between SIGTERM and SIGKILL when the supervisor stops a job."""


@dataclass
class AttemptReport:
    """What one attempt did, as the supervisor saw it (JSON-able)."""

    exit_code: int
    exit_class: str
    duration_s: float
    nodes: list[str]
    killed_by: str | None = None
    first_failure: dict[str, Any] | None = None
    suspects: list[dict[str, Any]] = field(default_factory=list)
    last_step: int | None = None
    launch_command: list[str] = field(default_factory=list)


@dataclass
class _Job:
    """A running job: one process per rank (local) or one launcher process (mpiexec, srun)."""

    procs: list[tuple[int, str, subprocess.Popen[bytes]]]  # (rank or -1 for a launcher, node, process)
    exits: dict[int, tuple[int, float]] = field(default_factory=dict)  # index -> (code, time)

    def poll(self, now: float) -> None:
        for i, (_, _, p) in enumerate(self.procs):
            if i not in self.exits and (code := p.poll()) is not None:
                self.exits[i] = (code, now)

    @property
    def done(self) -> bool:
        return len(self.exits) == len(self.procs)

    def first_failure(self) -> tuple[int, int, str, float] | None:
        failed = [(t, i, c) for i, (c, t) in self.exits.items() if c != 0]
        if not failed:
            return None
        t, i, code = min(failed)
        rank, node, _ = self.procs[i]
        return rank, code, node, t

    def signal(self, sig: int) -> None:
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
        self.signal(signal.SIGKILL)
        for _, _, p in self.procs:
            p.wait()
        self.poll(now())


def supervise(request: dict[str, Any]) -> dict[str, Any]:
    """Run one attempt described by `request` (see `engine.StageContext.launch`); return an AttemptReport dict."""
    run_dir = Path(request["run_dir"])
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    start = time.time()
    job, command = _start(request, run_dir)
    killed_by = _watch(job, request, start)
    duration = time.time() - start
    failure = job.first_failure()
    code = _exit_code(job, killed_by)
    metrics, _ = report.read_metrics(run_dir)
    last_step = metrics[-1]["step"] if metrics else None
    suspects = [] if killed_by == "interrupt" else _suspects(request, run_dir, failure, killed_by)
    exit_class = "cancelled" if killed_by == "interrupt" else exits.classify(code, suspects=bool(suspects))
    out = AttemptReport(
        exit_code=code,
        exit_class=exit_class,
        duration_s=round(duration, 3),
        nodes=list(request["hosts"]),
        killed_by=killed_by,
        first_failure=None if failure is None else {"rank": failure[0], "exit_code": failure[1], "node": failure[2],
                                                      "after_s": round(failure[3] - start, 3)},
        suspects=suspects,
        last_step=last_step,
        launch_command=command,
    )
    (run_dir / "supervisor.json").write_text(json.dumps(asdict(out), indent=2))
    return asdict(out)


def _start(request: dict[str, Any], run_dir: Path) -> tuple[_Job, list[str]]:
    from campaign.executors import launchers

    # "{python}" is the interpreter running this supervisor, i.e. the worker's environment.
    argv = tuple(sys.executable if a == "{python}" else a for a in request["argv"])
    plan = launchers.LaunchPlan(
        hosts=tuple(request["hosts"]),
        ranks_per_node=int(request["ranks_per_node"]),
        argv=argv,
        env=tuple(sorted(request.get("env", {}).items())),
        hostfile=request.get("hostfile"),
        master_port=request.get("master_port"),
    )
    base_env = {**os.environ, **dict(plan.env)}
    if request["launcher"] == "local":
        procs = []
        for rank, (argv, env) in enumerate(launchers.local_rank_processes(plan)):
            log = open(run_dir / "logs" / f"rank-{rank}.log", "wb")  # noqa: SIM115 - owned by the child
            p = subprocess.Popen(argv, env={**base_env, **env}, stdout=log, stderr=subprocess.STDOUT,
                                 cwd=run_dir, start_new_session=True)
            log.close()
            procs.append((rank, env.get("CAMPAIGN_NODE", ""), p))
        return _Job(procs), ["(local)", *plan.argv]
    command = launchers.build_command(request["launcher"], plan)
    log = open(run_dir / "logs" / "launcher.log", "wb")  # noqa: SIM115
    p = subprocess.Popen(command, env=base_env, stdout=log, stderr=subprocess.STDOUT, cwd=run_dir, start_new_session=True)
    log.close()
    return _Job([(-1, "", p)]), command


def _watch(job: _Job, request: dict[str, Any], start: float) -> str | None:
    """Wait for the job; return why the supervisor killed it, or None if it ended by itself."""
    timeout = float(request["timeout_s"])
    interrupt = request.get("interrupt")
    progress = _Progress(Path(request["run_dir"]))
    interrupted = False
    while True:
        now = time.time()
        job.poll(now)
        if job.done:
            return "interrupt" if interrupted else None
        if now - start > timeout:
            job.stop(time.time)
            return "timeout"
        if interrupt and not interrupted and progress.last_step() >= int(interrupt["after_step"]):
            job.signal(getattr(signal, interrupt.get("signal", "SIGKILL")))
            interrupted = True
        failure = job.first_failure()
        if failure is not None and now - failure[3] > FAILED_RANK_GRACE_S:
            job.stop(time.time)
            return "failed_rank"
        time.sleep(POLL_S)


class _Progress:
    """The newest step in metrics.jsonl, read incrementally."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.offset, self.step = run_dir, 0, 0

    def last_step(self) -> int:
        rows, self.offset = report.read_metrics(self.run_dir, self.offset)
        if rows:
            self.step = int(rows[-1]["step"])
        return self.step


def _exit_code(job: _Job, killed_by: str | None) -> int:
    if killed_by == "timeout":
        return exits.STALLED
    failure = job.first_failure()
    if failure is None:
        return 0
    code = failure[1]
    return 128 - code if code < 0 else code  # Popen: -N means killed by signal N


def _suspects(request: dict[str, Any], run_dir: Path, failure: tuple[int, int, str, float] | None,
              killed_by: str | None) -> list[dict[str, Any]]:
    """Nodes to blame, each with evidence. Systemic exits blame no node."""
    if failure is not None and failure[2] and exits.classify(_norm(failure[1]), suspects=True) == "crashed_node":
        rank, code, node, _ = failure
        return [{"node": node, "reason": f"rank {rank} exited first with {_norm(code)}", "evidence": {"rank": rank, "exit_code": _norm(code)}}]
    if killed_by == "timeout":
        return _silent_nodes(request, run_dir)
    return []


def _silent_nodes(request: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    beats = report.read_heartbeats(run_dir)
    steps = {node: min((int(r.get("step", 0)) for r in b.get("ranks", {}).values()), default=0) for node, b in beats.items()}
    lead = max(steps.values(), default=0)
    out = []
    for node in request["hosts"]:
        if node not in beats:
            out.append({"node": node, "reason": "no heartbeat at all", "evidence": {}})
        elif steps[node] < lead:
            out.append({"node": node, "reason": f"stuck at step {steps[node]} while others reached {lead}",
                        "evidence": {"step": steps[node], "lead": lead}})
    return out


def _norm(code: int) -> int:
    return 128 - code if code < 0 else code
