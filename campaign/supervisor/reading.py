"""What the supervisor reads of a running launch, behind one interface (`Observer.poll(now)
-> Observation`): the files the trainer writes (metrics.jsonl, events, heartbeats), or for
`trainer.progress: stdout` rank 0's output first, turned into metrics.jsonl rows."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from campaign import contract, report, rundir, runfiles, watchdog

if TYPE_CHECKING:
    from campaign.attempt import AttemptRequest
    from campaign.supervisor.launch import _Launch

SEEN_KEPT = 10_000
"""Reported steps kept to date a checkpoint's save (`contract.step_at_save`): far more than a
checkpoint interval's worth at any poll rate, and a bounded list in a run of a million steps."""

STDOUT_EVIDENCE = ("evidence: rank 0's output only (progress: stdout; no heartbeats, so no rank or phase is "
                   "named): its last step line and its log")
"""What a stall of a trainer read through its output can be judged on (docs/trainer-contract.md)."""

Seen = list[tuple[int, float, float]]
"""(step, earliest, latest): each reported step with the times it can have been reported at."""


class Observation(NamedTuple):
    """What one poll read."""

    rows: list[dict[str, Any]]
    """The new metrics rows (as the attempt's `runfiles.StepChain` accepts them)."""
    seen: Seen
    """The steps reported so far (the last `SEEN_KEPT`): they date the trainer's own checkpoints."""


class Observer(Protocol):
    """Reads a running launch and feeds its `watch` (`watchdog.Watch`)."""

    stdout: bool
    """Only rank 0's output is read (`progress: stdout`): no heartbeats, no other rank's progress."""

    @property
    def watch(self) -> watchdog.Watch:
        """What the polls fed: steps, events, phases, compute."""
        ...

    def poll(self, now: float) -> Observation: ...

    def last(self, now: float) -> Observation | None:
        """What the trainer printed just before the launch ended (None: nothing more to read)."""
        ...


@dataclass
class TrainerFiles:
    """The files a trainer of the contract writes: metrics.jsonl, events.jsonl, heartbeats."""

    run_dir: Path
    watch: watchdog.Watch
    chain: runfiles.StepChain
    offsets: dict[str, int] = field(default_factory=lambda: {"metrics": 0, "events": 0})
    seen: Seen = field(default_factory=list)  # the trainer's own metrics rows: (step, time, time)
    stdout = False

    def poll(self, now: float) -> Observation:
        rows = _observe(self.run_dir, self.watch, self.offsets, now, self.chain)
        self.seen += [(int(r["step"]), r["time"], r["time"]) for r in rows if r.get("time") is not None]
        del self.seen[:-SEEN_KEPT]
        return Observation(rows, self.seen)

    def last(self, now: float) -> Observation | None:
        return None


@dataclass
class RankZeroOutput:
    """`progress: stdout`: rank 0's output (`ProgressAdapter`) appended to metrics.jsonl, then
    read as `TrainerFiles` reads it; rank 0 exiting 0 after the attempt's last step is its
    `done` event (its output is complete)."""

    adapter: ProgressAdapter
    files: TrainerFiles
    launch: _Launch
    max_step: int
    stdout = True

    @property
    def watch(self) -> watchdog.Watch:
        return self.files.watch

    def poll(self, now: float) -> Observation:
        self.adapter.poll(now)
        rows = _observe(self.files.run_dir, self.watch, self.files.offsets, now, self.files.chain)
        if self.watch.final_event is None and _read_rank_finished(self.launch, self.max_step, self.watch,
                                                                  self.files.chain):
            # Rank 0 exited 0 after its last step: the training outcome is known; ranks whose
            # output is not read get exit_s to follow, then are stopped (exit_hung), not relaunched.
            self.watch.saw_events([{"event": "done", "step": self.watch.last_step}], now)
        return Observation(rows, self.adapter.seen)

    def last(self, now: float) -> Observation | None:
        self.adapter.poll(now)
        return Observation([], self.adapter.seen)


def observer(request: AttemptRequest, launch: _Launch, start: float) -> Observer:
    """The observer of `request`'s launch, with a fresh watch started at `start`."""
    watch = watchdog.Watch(started=start, prior_step_times=list(request.measured_step_s))
    files = TrainerFiles(Path(request.run_dir), watch, _chain(request))
    adapter = ProgressAdapter.for_request(request)
    if adapter is None:
        return files
    return RankZeroOutput(adapter, files, launch, _max_step(request))


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
    seen: Seen = field(default_factory=list)
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
        rows, self.offset = runfiles.read_progress_lines(self.log, self.pattern, self.offset)
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


def _read_rank_finished(launch: _Launch, target: int, watch: watchdog.Watch,
                        chain: runfiles.StepChain | None = None) -> bool:
    """With `progress: stdout`: has the rank whose output is read (rank 0; the launcher's with
    mpiexec/srun) exited 0 after reporting the attempt's last step `target`? (Its last row may
    still be held by the `chain`, waiting for a row that will not come: its output is complete.)"""
    for i, (rank, _, _) in enumerate(launch.procs):
        if rank == 0 and i in launch.exits:
            reached = max(watch.last_step, chain.tip if chain is not None else -1)
            return launch.exits[i][0] == 0 and reached >= target
    return False


def note_checkpoints(request: AttemptRequest, seen: Seen, start: float) -> None:
    """The step of each of the trainer's own checkpoints whose name gives none, from the steps
    reported around its save (`contract.note_checkpoint_steps`)."""
    t = request.targets
    if t is not None:
        every, at, folder = t.checkpoint_every, tuple(t.checkpoint_at), t.checkpoint_dir
    else:  # a request built by hand (tests, older callers): the same targets from its environment
        env = request.env
        every = int(env.get("CAMPAIGN_CHECKPOINT_EVERY") or 0)
        at = tuple(int(x) for x in (env.get("CAMPAIGN_CHECKPOINT_AT") or "").split(",") if x)
        folder = env["CAMPAIGN_CHECKPOINT_DIR"]
    contract.note_checkpoint_steps(request.checkpoint_layout, folder, seen, since=start,
                                   expected=contract.expected_saves(every, at))


def printed_between(rows: list[dict[str, Any]], earliest: float, latest: float) -> Seen:
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


def _max_step(request: AttemptRequest) -> int:
    """The attempt's last step as metrics.jsonl numbers it: a row past it is not progress.
    CAMPAIGN_MAX_STEPS is in the trainer's own numbering (`trainer.first_step`: a trainer
    counting from 0 is told one less), the rows in the ledger's (from 1)."""
    if request.targets is not None:
        last = request.targets.trainers_max_step + 1 - request.progress_first_step
    else:
        try:
            last = int(request.env.get("CAMPAIGN_MAX_STEPS", "")) + 1 - request.progress_first_step
        except ValueError:
            return runfiles.STEP_MAX
    return min(last, runfiles.STEP_MAX)


def _chain(request: AttemptRequest) -> runfiles.StepChain:
    """The attempt's metrics rows as its trainer can have written them: after the checkpoint it
    resumes from, up to its last step."""
    return runfiles.StepChain(max_step=_max_step(request), start=request.resume_step or 0)


def _observe(run_dir: Path, watch: watchdog.Watch, offsets: dict[str, int], now: float,
             chain: runfiles.StepChain) -> list[dict[str, Any]]:
    """Feed the watch what the run directory holds that is new (valid rows and events only: a
    bad line is skipped, the driver counts it; rows as the attempt's `chain` accepts them, so a
    forged row ahead never hides the real steps after it) and the heartbeats; the new metrics rows."""
    rows, offsets["metrics"] = runfiles.read_metrics(run_dir, offsets["metrics"], chain=chain)
    watch.saw_steps(rows, now)
    events, offsets["events"] = runfiles.read_events_from(run_dir, offsets["events"])
    watch.saw_events(events, now)
    beats = runfiles.read_heartbeats(run_dir)
    phases = {r.get("phase") for b in beats.values() for r in b.get("ranks", {}).values()}
    watch.saw_phases({p for p in phases if p}, now)
    watch.saw_compute(beats)
    return rows
