"""What a stage module sees of attempts: `StageContext` (launch attempts, exclude nodes,
record events, read references) and `AttemptOutcome` (one attempt's report plus what its
trainer wrote), the driver's side of `stagebase.Context` and `stagebase.Outcome`. The
context uses of the engine only its `Driver` protocol.

    outcome = ctx.launch(targets, nodes=4, timeout_s=600)           # one attempt, ingested
    outcome, first = ctx.launch_confirmed(targets, timeout_s=600)   # with the confirming retry

`ctx.launch` records the attempt in the ledger, builds its request (`campaign.attempt`),
runs it through the engine's attempt runner and ingests the trainer's metrics.jsonl while
it runs (idempotent per step). Only the driver process writes the ledger.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime as dt
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from campaign import contract, evidence, exits, goodput, reference, rundir, runfiles
from campaign.attempt import AttemptReport, AttemptRequest, Interrupt, build_request, no_rank_started, trainer_config
from campaign.errors import CampaignError, DiskFull, WorkdirError
from campaign.exits import ExitClass, NextAction
from campaign.ledger import reads, writes
from campaign.ledger.db import disk_full, transient
from campaign.ledger.models import Attempt, StageRun, utcnow
from campaign.stagebase import NoRankStarted, validated_copy
from campaign.watchdog import WatchdogPolicy

if TYPE_CHECKING:
    from campaign.block import Block
    from campaign.ledger import Ledger
    from campaign.observe import Observer
    from campaign.progress import Progress
    from campaign.reference import Reference
    from campaign.spec import CampaignSpec
    from campaign.stagebase import StageSpec, Targets
    from campaign.train.config import Fault, TrainerConfig

INGEST_PERIOD_S = 0.25
"""How often the driver looks at a running attempt: it renews nothing here but checks its
lease, ingests the new metrics rows (one transaction when there are any; none when there are
none), passes a cancel on as STOP and asks whether the block is still there. (Until issue 43
this read `1.0` and the loop slept a quarter of it: the period has always been 0.25 s.)"""


class Driver(Protocol):
    """What a stage context uses of the driver (`campaign.engine.Engine` is one): the campaign's
    spec and folders, the ledger and its writes that outlive an outage, the block that runs the
    attempts, where progress goes, and whether to stop. This protocol is the whole of that surface."""

    @property
    def spec(self) -> CampaignSpec: ...
    @property
    def spec_dir(self) -> Path: ...
    @property
    def run_root(self) -> Path: ...
    @property
    def site_name(self) -> str: ...
    @property
    def ledger(self) -> Ledger: ...
    @property
    def block(self) -> Block: ...
    @property
    def progress(self) -> Progress: ...
    @property
    def observer(self) -> Observer: ...
    @property
    def cancel_requested(self) -> bool: ...

    current_run_dir: Path | None
    """The run directory of the attempt running now (a cancel writes its STOP file); None between attempts."""

    def writes(self, what: str) -> Iterator[Any]: ...

    def ledger_unreachable(self, error: BaseException) -> None: ...

    def check_cancel(self) -> None: ...

    def check_lease(self) -> None: ...


@dataclass
class AttemptOutcome:
    """An attempt as a stage sees it: the supervisor's report plus what the trainer wrote."""

    attempt_id: int
    number: int
    run_dir: Path
    nodes: list[str]
    world_size: int
    report: AttemptReport
    metrics: list[dict[str, Any]]
    startup: dict[str, Any] | None
    checkpoints: list[dict[str, Any]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return self.report.exit_code

    @property
    def exit_class(self) -> str:
        return self.report.exit_class

    @property
    def suspects(self) -> list[dict[str, Any]]:
        return list(self.report.suspects)

    @property
    def last_step(self) -> int | None:
        return self.report.last_step

    @property
    def losses(self) -> dict[int, float]:
        return {int(m["step"]): m["loss"] for m in self.metrics}

    @property
    def rank0_log(self) -> Path:
        """Rank 0's output: its own log (local launcher) or the launcher's (mpiexec, srun)."""
        own = rundir.rank_log(self.run_dir, 0)
        return own if own.exists() else rundir.launcher_log(self.run_dir)

    def as_dict(self) -> dict[str, Any]:
        files = {name: (self.run_dir / name).exists() for name in (rundir.METRICS_FILE, rundir.STARTUP_FILE)}
        return {**self.report.to_dict(), "metrics": self.metrics, "startup": self.startup, "world_size": self.world_size,
                "checkpoints": self.checkpoints, "run_dir": str(self.run_dir), "log": str(self.rank0_log),
                "files": files}


class StageContext:
    """What a stage module may do (`stagebase.Context`): launch attempts, exclude nodes, report
    events, read references."""

    def __init__(self, engine: Driver, run: StageRun, stage: StageSpec) -> None:
        self.engine, self.run, self.stage = engine, run, stage
        self.spec = engine.spec
        self.stage_dir = engine.run_root / run.name
        self._bad_rows: dict[int, dict[str, Any]] = {}  # attempt id -> summary["bad_metric_rows"] so far
        self._read_at: dict[int, tuple[int, runfiles.StepChain]] = {}  # attempt id -> (next line, its rows) of metrics.jsonl
        self._drills: dict[int, str] = {}  # attempt id -> the drill it ran (spec faults), for scoped exclusions
        self._ingested_to: dict[int, int] = {}  # attempt id -> byte offset of metrics.jsonl ingested so far

    @property
    def ledger(self) -> Ledger:
        return self.engine.ledger

    def reference_losses(self, ref: Reference) -> dict[int, float]:
        """Losses by step of a reference: a ledger stage run or a CSV next to the campaign file."""
        if ref.file:  # relative to the campaign file's folder, `~` expanded, as the preflight checked it
            return reference.read_csv(contract.spec_path(ref.file, self.engine.spec_dir))
        assert ref.stage_run is not None
        return reference.from_ledger(self.ledger, ref.stage_run)

    def stage_progress(self) -> dict[str, Any]:
        """What the ledger holds of this stage run so far (all attempts, orphans adopted on
        recovery included): its step, tokens and last loss."""
        with self.ledger.session() as s:
            run = s.get(StageRun, self.run.id)
            assert run is not None
            return {"step": run.steps, "tokens": run.tokens, "loss": run.last_loss}

    def attempts_made(self) -> int:
        """How many attempts this stage run has had (every driver's): the next one is this + 1."""
        with self.ledger.session() as s:
            run = s.get(StageRun, self.run.id)
            assert run is not None
            return int(run.attempts_count)

    def steps_for_tokens(self, tokens: int, nodes: int | None) -> int:
        """Steps that train at least `tokens` tokens at this stage's node count."""
        from campaign.stagebase import steps_for_tokens

        return steps_for_tokens(self.spec, tokens, nodes)

    def show_table(self, title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
        self.engine.progress.table(f"{self.run.name}: {title}", rows, columns)

    def event(self, kind: str, message: str, *, attempt_id: int | None = None, data: dict[str, Any] | None = None) -> None:
        """Record an event in the ledger and show it."""
        for unit in self.engine.writes("recording an event"):
            with unit as s:
                run = s.get(StageRun, self.run.id)
                assert run is not None
                a = s.get(Attempt, attempt_id) if attempt_id else None
                writes.add_event(s, run.campaign, kind, message, stage_run=run, attempt=a, data=data)
        self.engine.progress.event(message)

    def exclude_suspects(self, outcome: AttemptOutcome, *, hours: float | None,
                         only: list[str] | None = None) -> list[str]:
        """Exclude the outcome's suspect nodes (those in `only`, if given) on this site, with
        their evidence; returns the nodes excluded."""
        return self._exclude(outcome, [s for s in outcome.suspects if only is None or s["node"] in only], hours)

    def reclassify(self, outcome: AttemptOutcome, changes: dict[str, Any]) -> AttemptOutcome:
        """Record what a later look at the evidence says of a finished attempt (the confirming
        retry's verdict): its exit class, suspects, error and finding (fields of its report)."""
        outcome.report = dataclasses.replace(outcome.report, **changes)
        for unit in self.engine.writes("recording the confirmed verdict"):
            with unit as s:
                a = s.get(Attempt, outcome.attempt_id)
                assert a is not None
                a.state = outcome.exit_class
                a.suspects = list(outcome.suspects)
                a.summary = {**(a.summary or {}), **_summary(outcome.report)}
        return outcome

    def confirm(self, first: AttemptOutcome, retry: AttemptOutcome) -> AttemptOutcome:
        """The confirming retry's outcome with what the two failures say together
        (`evidence.confirm`): the failure followed the node, the rank, or moved."""
        before, now = first.report.finding, retry.report.finding
        if not before or not now or retry.exit_code == 0:
            return retry
        placements = (list(first.report.nodes), list(retry.report.nodes))
        finding = evidence.confirm(evidence.Finding.from_dict(before), evidence.Finding.from_dict(now), placements)
        cls = exits.classify_finding(retry.exit_code, finding.kind)
        self.event("confirmed", f"confirming retry: {finding.message}", attempt_id=retry.attempt_id,
                   data={"finding": finding.to_dict()})
        return self.reclassify(retry, {"finding": finding.to_dict(), "exit_class": cls, "error": finding.message,
                                       "suspects": [s.to_dict() for s in finding.suspects]})

    def launch_confirmed(self, targets: Targets, *, retry_targets: Targets | None = None,
                         before_retry: Callable[[AttemptOutcome], Targets | None] | None = None,
                         **kw: Any) -> tuple[AttemptOutcome, AttemptOutcome | None]:
        """`launch`, and when the attempt ends in a class the evidence can neither pin on a node
        nor call systemic (`exits.CONFIRM_ONCE`: a one-off abort, say), the one confirming retry
        the finding promised, with the ranks moved to other nodes (`retry_targets`, if given).
        `before_retry(first)`: called before the retry (a stage puts back the state under test,
        e.g. the checkpoint to resume from); the targets it returns, if any, are the retry's.
        Returns the outcome to judge (the retry's, with `confirm`'s reading of both failures)
        and the first outcome when a retry was made (None otherwise)."""
        first = self.launch(targets, **kw)
        if exits.follows(first.exit_class) is not NextAction.CONFIRM:
            return first, None
        label = ", ".join(x for x in (kw.get("label"), "confirming retry") if x)
        again = before_retry(first) if before_retry is not None else None
        retry = self.launch(again or retry_targets or targets, **{**kw, "label": label, "rotate": 1})
        return self.confirm(first, retry), first

    def exclude_stragglers(self, outcome: AttemptOutcome, *, hours: float | None) -> list[str]:
        """Exclude the outcome's straggler nodes (the spec asked for it)."""
        found = [{"node": st["node"], "reason": f"straggler: {st['ratio']:.1f}x the other nodes' compute time",
                  "evidence": st} for st in outcome.report.stragglers]
        return self._exclude(outcome, found, hours)

    def drill_of(self, outcome: AttemptOutcome) -> str | None:
        """What drill faulted this attempt, if one did: `campaign inject` (its marker in the
        run directory) or the spec's `faults`. None for a real fault."""
        injected = rundir.read_json(outcome.run_dir / rundir.INJECTED_FILE)
        if injected is not None:
            return f"`campaign inject {injected.get('fault', '?')}` on rank {injected.get('rank', '?')}"
        return self._drills.get(outcome.attempt_id)

    def _exclude(self, outcome: AttemptOutcome, suspects: list[dict[str, Any]], hours: float | None) -> list[str]:
        """Exclude `suspects` on the site, for `hours`. After a drill the exclusion binds
        this campaign only (and goes with it): a deliberate fault says nothing about the
        node, and must not take it from the site's other campaigns."""
        expires = utcnow() + dt.timedelta(hours=hours) if hours else None
        drill = self.drill_of(outcome)
        lines = []
        for unit in self.engine.writes("recording exclusions"):
            with unit as s:
                names, lines = [], []
                a = s.get(Attempt, outcome.attempt_id)
                assert a is not None
                c = a.stage_run.campaign
                for sus in suspects:
                    evidence = {**sus.get("evidence", {}), "attempt": outcome.number, "exit_class": outcome.exit_class,
                                "stall": outcome.report.stall, **({"drill": drill} if drill else {})}
                    writes.exclude_node(s, site=self.engine.site_name, node=sus["node"], reason=sus["reason"],
                                        evidence=evidence, attempt=a, expires=expires, campaign=c if drill else None)
                    line = exclusion_line(sus["node"], sus["reason"], self.engine.site_name, c.name if drill else None,
                                          drill, hours)
                    writes.add_event(s, c, "node_excluded", line, stage_run=a.stage_run, attempt=a,
                                     data={"node": sus["node"], "evidence": evidence, "campaign_only": bool(drill)})
                    names.append(sus["node"])
                    lines.append(line)
        for line in lines:
            self.engine.progress.event(line)
        return names

    def launch(self, targets: Targets, *, nodes: int | None = None, timeout_s: float,
               faults: tuple[Fault, ...] = (), label: str = "", interrupt: dict[str, Any] | None = None,
               watchdog: WatchdogPolicy | None = None, rotate: int = 0) -> AttemptOutcome:
        """Run one attempt of the trainer to `targets` on `nodes` active nodes and return its outcome.

        `targets.resume`: continue from the newest complete checkpoint in the stage's folder
        `targets.checkpoints`. `interrupt`: {"after_step": S, "signal": "SIGKILL"|"SIGTERM"}: the
        supervisor sends the signal to the whole launch once step S is reported (a deliberate
        interruption). `rotate`: move ranks to other nodes (see `AttemptRequest.rotate`).
        """
        self.engine.check_cancel()
        n = nodes or self.spec.site.nodes
        ckpt = self.stage_dir / targets.checkpoints
        policy = watchdog or WatchdogPolicy()
        number, attempt_id, excluded, measured = self._new_attempt(targets, n, label, policy)
        run_dir = rundir.attempt_dir(self.stage_dir, number)
        if faults:
            self._drills[attempt_id] = "a fault the spec injects"
        config = trainer_config(self.spec, targets, stage_dir=self.stage_dir, attempt=number, faults=faults,
                                spec_dir=self.engine.spec_dir)
        resume_from = contract.newest_complete(self.spec.trainer.checkpoints, ckpt) if targets.resume else None
        request = self._request(config, run_dir, n, excluded, timeout_s, resume_from, watchdog,
                                interrupt=interrupt, rotate=rotate, measured=measured)
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            request.config_path.write_text(config.model_dump_json(indent=2))
        except OSError as e:  # a full or read-only work directory: not the stage's fault, nothing launched
            self._unlaunched(attempt_id, run_dir, e)
        steps = targets.steps
        self._read_at[attempt_id] = (1, _chain(request, steps))
        self.engine.progress.attempt_started(self.run.name, number, n, steps, label)
        self.engine.current_run_dir = run_dir
        try:
            rep, offset = self._run_on_block(request, attempt_id, steps, excluded)
            self.engine.current_run_dir = None
            self._ingest(attempt_id, run_dir, offset, steps, last=True)
            outcome = self._finish(attempt_id, number, run_dir, rep, ckpt, _chain(request, steps))
        except (DiskFull, OSError) as e:
            if not disk_full(e):
                raise
            full = e if isinstance(e, DiskFull) else DiskFull(
                f"cannot write in {run_dir}: {e.strerror or e}; free space there, then `campaign resume "
                f"{self.spec.name}` continues")
            self._stopped_by_full_disk(attempt_id, run_dir, steps, full)
            raise full from None
        why = no_rank_started(rep, ranks_wrote=bool(outcome.metrics or (outcome.startup or {}).get("ranks")))
        if why is not None:
            raise NoRankStarted(why, number)
        return outcome

    def _new_attempt(self, targets: Targets, n: int, label: str,
                     policy: WatchdogPolicy) -> tuple[int, int, list[str], list[float]]:
        """The attempt's row (running); its number and id, the nodes the ledger excludes for
        it, and the step times its stage already measured at `n` nodes."""
        ranks_per_node = self.spec.site.ranks_per_node
        for unit in self.engine.writes("recording a new attempt"):
            with unit as s:
                run = s.get(StageRun, self.run.id)
                assert run is not None
                a = writes.create_attempt(s, run, nodes=[], ranks_per_node=ranks_per_node, run_dir="",
                                          label=label, tokens_base=_tokens_base(run, targets.resume),
                                          target_steps=targets.steps, wanted=n)
                a.run_dir = str(rundir.attempt_dir(self.stage_dir, a.number))
                number, attempt_id = a.number, a.id
                excluded = sorted({e.node for e in reads.list_exclusions(s, self.engine.site_name,
                                                                         for_campaign=run.campaign_id)})
                measured = reads.measured_step_times(s, run.id, nodes=n, ranks_per_node=ranks_per_node,
                                                     skip=policy.warmup_steps)
        return number, attempt_id, excluded, measured

    def _request(self, config: TrainerConfig, run_dir: Path, n: int, excluded: list[str], timeout_s: float,
                 resume_from: dict[str, Any] | None, watchdog: WatchdogPolicy | None, *,
                 interrupt: dict[str, Any] | None, rotate: int, measured: list[float]) -> AttemptRequest:
        """The supervisor's request for the attempt (`attempt.build_request`), with the ranks
        moved by `rotate` and the step times measured so far."""
        from campaign.supervisor import free_port

        request = build_request(self.spec.site, config, run_dir=run_dir, nodes=n, excluded=excluded,
                                timeout_s=timeout_s, master_port=free_port(), spec_dir=self.engine.spec_dir,
                                resume_from=resume_from, watchdog=watchdog,
                                interrupt=Interrupt.model_validate(interrupt) if interrupt else None)
        if rotate:
            request = validated_copy(request, rotate=rotate)
        if measured:
            request = validated_copy(request, measured_step_s=measured)
        return request

    def _run_on_block(self, request: AttemptRequest, attempt_id: int, steps: int,
                      excluded: list[str]) -> tuple[AttemptReport, int]:
        """`_supervise`, and once more when the block could not give the attempt its nodes
        (a new block) or never started (a fresh load)."""
        rep, offset = self._supervise(request, attempt_id, steps)
        if rep.short_of_nodes and self.engine.block.renew(excluded):
            # The block has too few usable nodes left (spares spent): a new block, then again.
            rep, offset = self._supervise(request, attempt_id, steps)
        elif rep.block_failed and self.engine.block.restart(rep.error or ""):
            # Parsl gives up on an executor whose block never started; a fresh load, then again.
            rep, offset = self._supervise(request, attempt_id, steps)
        return rep, offset

    def _stopped_by_full_disk(self, attempt_id: int, run_dir: Path, steps: int, e: DiskFull) -> None:
        """The ledger's or the run directory's disk is full under the attempt: stop its launch
        (nothing may train on unrecorded), see it gone, then close its row with what it left,
        with the ledger's reserve (`Ledger.closing`). The driver then stops (DiskFull, exit 2)."""
        stopped = self._stop_launch(run_dir)
        self.engine.current_run_dir = None
        self.ledger.closing = True
        with contextlib.suppress(CampaignError):  # no room even so: `resume` adopts the rows from metrics.jsonl
            self._ingest(attempt_id, run_dir, self._ingested_to.get(attempt_id, 0), steps, last=True)
        for unit in self.engine.writes("recording the attempt stopped by a full disk"):
            with unit as s:
                a = s.get(Attempt, attempt_id)
                assert a is not None
                if a.state == "running":
                    writes.finish_attempt(s, a, state=ExitClass.CRASHED_SYSTEMIC, exit_code=None, suspects=[],
                                          summary={"error": f"{e}; {stopped}", "last_step": _last_step(run_dir)})

    def _unlaunched(self, attempt_id: int, run_dir: Path, e: OSError) -> NoReturn:
        """Close the attempt row of a launch the driver could not prepare, and stop the driver
        with one line naming the cause (WorkdirError, exit 2): the campaign stays resumable."""
        why = f"cannot write the attempt's run directory {run_dir}: {e.strerror or e}"
        for unit in self.engine.writes("recording an attempt that could not start"):
            with unit as s:
                a = s.get(Attempt, attempt_id)
                assert a is not None
                writes.finish_attempt(s, a, state=ExitClass.CRASHED_SYSTEMIC, exit_code=None, suspects=[],
                                      summary={"error": why})
        raise WorkdirError(f"{why}; free space there (or fix its permissions), then `campaign resume "
                           f"{self.spec.name}`") from None

    def _supervise(self, request: AttemptRequest, attempt_id: int, steps: int) -> tuple[AttemptReport, int]:
        """Start the supervisor through the engine's runner and ingest metrics until it returns."""
        run_dir = Path(request.run_dir)
        future = self.engine.block.start(request)
        offset = 0
        while not future.done():
            time.sleep(INGEST_PERIOD_S)
            self.engine.check_lease()
            offset = self._ingest(attempt_id, run_dir, offset, steps)
            if self.engine.cancel_requested:
                rundir.write_stop(run_dir)
            lost = self.engine.block.lost()
            ended = self.engine.block.ended() if lost is None else None
            if lost is not None or ended is not None:
                # The future would never complete (the interchange is gone), or only minutes
                # after the block's job ended (the interchange's heartbeat threshold): stop the
                # attempt ourselves (launch or job). A lost interchange is restarted once, on
                # the same request (`block_failed`); an ended job gets a new block now.
                why = f"{lost or ended}; {self._stop_launch(run_dir)}"
                if ended is not None:
                    self.engine.block.replace(ended)
                return _block_gone(why, run_dir, block_failed=lost is not None), offset
        try:
            return AttemptReport.from_dict(future.result()), offset
        except Exception as e:  # the app itself failed: its block ended, or a bug/serialization problem
            # Its supervisor is gone (a lost worker: kill -9, the OOM killer) but the ranks it
            # launched may train on: stop them, and see them gone, before anything relaunches
            # into the same checkpoint folder; the last ingestion then takes all they wrote.
            stopped = self._stop_launch(run_dir)
            rep = _app_failure(e, run_dir)
            return dataclasses.replace(rep, error=f"{rep.error}; {stopped}"), offset

    def _stop_launch(self, run_dir: Path) -> str:
        """Stop an attempt's launch that its supervisor no longer watches (`recovery.stop_orphan`)
        and clear the STOP file that did it, so a relaunch may start; what was done, in words."""
        from campaign.recovery import stop_orphan

        stopped = stop_orphan(run_dir, self.spec.site)
        with contextlib.suppress(OSError):
            (run_dir / rundir.STOP_FILE).unlink(missing_ok=True)
        return stopped

    def _ingest(self, attempt_id: int, run_dir: Path, offset: int, steps: int, *, last: bool = False) -> int:
        """Ingest metrics.jsonl from `offset`; returns the offset to go on from. While the
        ledger does not answer, the offset stays: the rows are ingested at a later tick
        (metrics.jsonl is the buffer), and the attempt goes on. `last`: the attempt has
        ended, there is no later tick: retry through the outage (`Ledger.retrying`).
        Rows are checked (`runfiles.check_metrics_row`, and by their place among the attempt's
        rows: `runfiles.StepChain`, steps beyond `steps` included): a bad one is skipped and
        counted, and the driver warns once per attempt. A row held by the chain (a jump ahead,
        waiting for the next row) is ingested once confirmed, or at the `last` read."""
        line, kept = self._read_at.get(attempt_id) or (1, runfiles.StepChain(max_step=steps))
        chain = copy.deepcopy(kept)  # a read the ledger refuses is read again from the same state
        got = runfiles.read_metrics_checked(run_dir, offset, line=line, chain=chain, final=last)
        earlier = self._bad_rows.get(attempt_id)
        bad = runfiles.bad_rows_summary(got, run_dir, earlier)
        if not (got.rows or got.bad):
            self._read_at[attempt_id] = (got.line, chain)  # a row held by the chain is not read again
            return got.offset
        if last:
            for unit in self.engine.writes("ingesting the attempt's last steps"):
                with unit as s:
                    number = self._write_rows(s, attempt_id, got.rows, bad, earlier, run_dir)
        else:
            try:
                with self.ledger.session() as s:
                    number = self._write_rows(s, attempt_id, got.rows, bad, earlier, run_dir)
            except Exception as e:
                if not transient(e):
                    raise
                self.engine.ledger_unreachable(e)
                return offset  # read again at the next tick: nothing counted twice
        self._read_at[attempt_id] = (got.line, chain)
        self._ingested_to[attempt_id] = got.offset
        if bad is not None and earlier is None:
            self.engine.progress.event(f"warning: {self.run.name} attempt {number}: {reads.bad_rows_line(bad)}")
        if bad is not None:
            self._bad_rows[attempt_id] = bad
        if got.rows:
            self.engine.observer.steps(self.run.name, number, got.rows, version=self.run.version)
            self.engine.progress.steps(self.run.name, got.rows[-1], steps)
        return got.offset

    def _record_fallbacks(self, attempt_id: int, number: int, events: list[dict[str, Any]]) -> None:
        """A ledger event for each checkpoint the trainer skipped at its start (a checksum or
        size that does not match meta.json, a failed load), naming the one it really loaded."""
        loaded = next((str(e.get("path")) for e in events if e["event"] == "checkpoint_loaded"), None)
        for e in events:
            if e["event"] == "checkpoint_skipped":
                data = {"path": str(e.get("path")), "why": str(e.get("why")), "loaded": loaded}
                self.event("checkpoint_skipped", f"{self.run.name} attempt {number}: checkpoint {data['path']} skipped "
                           f"({data['why']}); loaded {loaded or 'none: started from step 0'}",
                           attempt_id=attempt_id, data=data)

    @staticmethod
    def _write_rows(s: Any, attempt_id: int, rows: list[dict[str, Any]], bad: dict | None, earlier: dict | None,
                    run_dir: Path) -> int:
        """One unit of ingestion: the rows, and the bad-row count when it grew; the attempt's
        number. The attempt's nodes come from its hostfile while it runs (status shows them)."""
        a = s.get(Attempt, attempt_id)
        assert a is not None
        if not a.nodes:
            a.nodes = rundir.launched_nodes(run_dir)
        writes.ingest_steps(s, a, rows)
        if bad is not earlier:
            writes.record_bad_metric_rows(s, a, bad, first=earlier is None)
        return int(a.number)

    def _finish(self, attempt_id: int, number: int, run_dir: Path, rep: AttemptReport, ckpt: Path,
                chain: runfiles.StepChain) -> AttemptOutcome:
        # the whole file with a fresh chain: the bad-row count is exact
        checked = runfiles.read_metrics_checked(run_dir, chain=chain, final=True)
        metrics, summary = checked.rows, _summary(rep)
        bad = runfiles.bad_rows_summary(checked, run_dir)
        if bad is not None:
            summary["bad_metric_rows"] = bad
        events = runfiles.read_events_checked(run_dir)
        bad_events = runfiles.bad_rows_summary(events, run_dir, name=rundir.EVENTS_FILE)
        checkpoints = contract.list_checkpoints(self.spec.trainer.checkpoints, ckpt) if ckpt.exists() else []
        for unit in self.engine.writes("recording the attempt's end"):
            with unit as s:
                a = s.get(Attempt, attempt_id)
                assert a is not None
                a.nodes = list(rep.nodes)
                for ck in (c for c in checkpoints if c["step"] is not None):  # a step not yet known: not recorded
                    writes.record_checkpoint(s, a.stage_run, a, step=ck["step"], tokens=ck.get("tokens") or 0,
                                             path=str(ck["path"]), complete=bool(ck["complete"]))
                writes.finish_attempt(s, a, state=rep.exit_class, exit_code=rep.exit_code,
                                      suspects=list(rep.suspects), summary=summary)
                if bad_events is not None:
                    writes.record_bad_event_rows(s, a, bad_events)
                goodput.record_attempt(s, a, events.rows)
        if bad_events is not None:
            self.engine.progress.event(f"warning: {self.run.name} attempt {number}: {reads.bad_rows_line(bad_events)}")
        self._record_fallbacks(attempt_id, number, events.rows)
        self.engine.progress.attempt_finished(self.run.name, number, rep.to_dict())
        if rep.rescue:
            self.event("rescue", rescue_message(rep.rescue), attempt_id=attempt_id, data=rep.rescue)
        for st in rep.stragglers:
            self.event("straggler", f"straggler {st['node']}: computes {st['ratio']:.1f}x as long per step as the "
                       f"other nodes' median ({st['compute_s'] * 1000:.0f} ms vs {st['others_median_s'] * 1000:.0f} ms)",
                       attempt_id=attempt_id, data=st)
        nodes = list(rep.nodes)
        return AttemptOutcome(attempt_id, number, run_dir, nodes, len(nodes) * self.spec.site.ranks_per_node, rep,
                              metrics, runfiles.read_startup(run_dir), checkpoints)


def rescue_message(r: dict[str, Any]) -> str:
    """One line for the ledger's event of a rescue (the supervisor's `rescue` report)."""
    if r.get("saved"):
        return (f"rescue checkpoint of step {r['step']} saved by rank {r['rank']} in {r.get('seconds', 0):.2f} s "
                f"(asked {r.get('waited_s', 0):.2f} s before the launch was stopped)")
    return f"no rescue checkpoint: {r.get('why', 'unknown')}"


def _chain(request: AttemptRequest, steps: int) -> runfiles.StepChain:
    """A fresh judge of the attempt's metrics rows: after the checkpoint it resumes from, up to `steps`."""
    return runfiles.StepChain(max_step=steps, start=request.resume_step or 0)


def _last_step(run_dir: Path) -> int | None:
    metrics, _ = runfiles.read_metrics(run_dir)
    return metrics[-1]["step"] if metrics else None


def _block_gone(why: str, run_dir: Path, *, block_failed: bool) -> AttemptReport:
    """The report of an attempt whose block went away under it (its interchange exited, or
    its scheduler job ended), written by the driver."""
    return AttemptReport(exit_code=143, exit_class=ExitClass.BLOCK_LOST, block_failed=block_failed, duration_s=0.0,
                         nodes=rundir.launched_nodes(run_dir), last_step=_last_step(run_dir), error=why)


def _app_failure(e: Exception, run_dir: Path) -> AttemptReport:
    """The report of an attempt whose supervisor app never returned, written by the driver."""
    from parsl.executors.errors import BadStateException
    from parsl.executors.high_throughput.errors import ManagerLost, WorkerLost

    lost = isinstance(e, (ManagerLost, WorkerLost))
    unstarted = isinstance(e, BadStateException)  # the block's workers never registered
    what = ("the block failed to start its worker" if unstarted else "the block ended under the attempt" if lost
            else "supervisor app failed")
    return AttemptReport(exit_code=143 if lost or unstarted else 1,
                                exit_class=ExitClass.BLOCK_LOST if lost or unstarted else ExitClass.CRASHED_SYSTEMIC,
                                block_failed=unstarted, duration_s=0.0, nodes=[],
                                last_step=_last_step(run_dir), error=f"{what}: {str(e)[:2000]}")


def _tokens_base(run: StageRun, resume: bool) -> int:
    """Stage tokens before a new attempt: a resuming attempt continues the chain of the
    newest earlier attempt (its cumulative tokens go on from the checkpoint); a fresh one
    adds to what the stage already trained."""
    if resume and run.attempts:
        return int(run.attempts[-1].tokens_base)
    return int(run.tokens)


def _summary(rep: AttemptReport) -> dict[str, Any]:
    """What the ledger keeps of a report (attempt.summary): the fields a user reads later."""
    keep = ("duration_s", "killed_by", "stall", "first_failure", "launch_command", "launch_text", "error",
            "detected_after_s", "spares", "allocation", "stragglers", "finding", "rescue")
    doc = rep.to_dict()
    return {k: doc[k] for k in keep if doc[k] not in (None, [])}


def exclusion_line(node: str, reason: str, site: str, campaign: str | None, drill: str | None,
                   hours: float | None) -> str:
    """What the driver says (and records) when it excludes a node: why, for whom, for how
    long, and the exact command that lifts it."""
    scope = f" for campaign {campaign} only (a drill)" if campaign else f" on site {site}"
    until = f" for {hours:g} h" if hours else ""
    return f"excluded {node}{scope}{until}: {reason}; lift: campaign nodes include {node} --site {site}"

