"""The engine: runs a campaign's stages in order, through Parsl, recording everything.

    engine = Engine(spec, ledger, workdir=Path("campaigns"))
    code = engine.submit(source_text)    # 0 all passed, 1 a stage failed, 130 cancelled

One submission: take the campaign's lease (one driver at a time), recover what a crashed
driver left (open attempts become `orphaned`, their jobs are stopped), load one Parsl
config of the site, and for each stage not yet passed hand its module a `StageContext`;
the stage asks for attempts (`ctx.launch(...)`). An attempt is one call of the supervisor
app; while it runs, the engine ingests its `metrics.jsonl` into the ledger and shows
progress. Only this process writes the ledger.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import socket
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from campaign import reference, report, stages
from campaign.errors import CampaignConflict
from campaign.lease import DriverLease, process_alive
from campaign.ledger import Ledger
from campaign.ledger import queries as q
from campaign.ledger.models import Attempt, Campaign, StageRun, utcnow
from campaign.progress import Progress
from campaign.reference import Reference
from campaign.spec import CampaignSpec
from campaign.stagebase import StageSpec, Verdict
from campaign.supervisor import PIDS_FILE, STOP_FILE, free_port
from campaign.train.config import Fault, RunConfig, TrainerConfig
from campaign.watchdog import WatchdogPolicy

INGEST_PERIOD_S = 1.0
"""How often a running attempt's metrics are ingested (one transaction each time)."""
DRIVER_FILE = "driver.json"
"""In the campaign directory: the driver's pid and its Parsl interchange's, for a successor to reap."""
EXIT_CANCELLED = 130
"""`campaign submit` exit code when the campaign was cancelled."""


class Cancelled(Exception):
    """The driver was asked to stop (SIGTERM/SIGINT, `campaign cancel`)."""


@dataclass
class AttemptOutcome:
    """An attempt as a stage sees it: the supervisor's report plus what the trainer wrote."""

    attempt_id: int
    number: int
    run_dir: Path
    nodes: list[str]
    world_size: int
    report: dict[str, Any]
    metrics: list[dict[str, Any]]
    startup: dict[str, Any] | None
    checkpoints: list[dict[str, Any]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return int(self.report["exit_code"])

    @property
    def exit_class(self) -> str:
        return str(self.report["exit_class"])

    @property
    def suspects(self) -> list[dict[str, Any]]:
        return list(self.report.get("suspects") or [])

    @property
    def last_step(self) -> int | None:
        return self.report.get("last_step")

    @property
    def losses(self) -> dict[int, float]:
        return {int(m["step"]): m["loss"] for m in self.metrics}

    def as_dict(self) -> dict[str, Any]:
        return {**self.report, "metrics": self.metrics, "startup": self.startup, "world_size": self.world_size,
                "checkpoints": self.checkpoints}


class StageContext:
    """What a stage module may do: launch attempts, exclude nodes, report events, read references."""

    def __init__(self, engine: Engine, run: StageRun, stage: StageSpec) -> None:
        self.engine, self.run, self.stage = engine, run, stage
        self.spec = engine.spec
        self.stage_dir = engine.campaign_dir / run.name
        self._app: Any = None

    @property
    def ledger(self) -> Ledger:
        return self.engine.ledger

    def reference_losses(self, ref: Reference) -> dict[int, float]:
        """Losses by step of a reference: a ledger stage run or a CSV next to the campaign file."""
        if ref.file:
            path = Path(ref.file)
            return reference.read_csv(path if path.is_absolute() else self.engine.spec_dir / path)
        assert ref.stage_run is not None
        return reference.from_ledger(self.ledger, ref.stage_run)

    def steps_for_tokens(self, tokens: int, nodes: int | None) -> int:
        """Steps that train at least `tokens` tokens at this stage's node count."""
        from campaign.train.shapes import shape_for

        t = self.spec.trainer
        ranks = (nodes or self.spec.site.nodes) * self.spec.site.ranks_per_node
        per_step = shape_for(self.spec.model).seq_len * t.micro_batch_size * t.grad_accum * ranks
        return -(-tokens // per_step)

    def show_table(self, title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
        self.engine.progress.table(f"{self.run.name}: {title}", rows, columns)

    def event(self, kind: str, message: str, *, attempt_id: int | None = None, data: dict[str, Any] | None = None) -> None:
        """Record an event in the ledger and show it."""
        with self.ledger.session() as s:
            run = s.get(StageRun, self.run.id)
            assert run is not None
            a = s.get(Attempt, attempt_id) if attempt_id else None
            q.add_event(s, run.campaign, kind, message, stage_run=run, attempt=a, data=data)
        self.engine.progress.event(message)

    def exclude_suspects(self, outcome: AttemptOutcome, *, hours: float | None) -> list[str]:
        """Exclude the outcome's suspect nodes on this site, with their evidence; returns them."""
        return self._exclude(outcome, outcome.suspects, hours)

    def exclude_stragglers(self, outcome: AttemptOutcome, *, hours: float | None) -> list[str]:
        """Exclude the outcome's straggler nodes (the spec asked for it)."""
        found = [{"node": st["node"], "reason": f"straggler: {st['ratio']:.1f}x the other nodes' compute time",
                  "evidence": st} for st in outcome.report.get("stragglers") or []]
        return self._exclude(outcome, found, hours)

    def _exclude(self, outcome: AttemptOutcome, suspects: list[dict[str, Any]], hours: float | None) -> list[str]:
        expires = utcnow() + dt.timedelta(hours=hours) if hours else None
        names = []
        with self.ledger.session() as s:
            a = s.get(Attempt, outcome.attempt_id)
            assert a is not None
            for sus in suspects:
                evidence = {**sus.get("evidence", {}), "attempt": outcome.number, "exit_class": outcome.exit_class,
                            "stall": outcome.report.get("stall")}
                q.exclude_node(s, site=self.engine.site_name, node=sus["node"], reason=sus["reason"],
                               evidence=evidence, attempt=a, expires=expires)
                q.add_event(s, a.stage_run.campaign, "node_excluded", f"excluded {sus['node']}: {sus['reason']}",
                            stage_run=a.stage_run, attempt=a, data={"node": sus["node"], "evidence": evidence})
                names.append(sus["node"])
        for sus in suspects:
            self.engine.progress.event(f"excluded {sus['node']}: {sus['reason']}")
        return names

    def launch(self, *, steps: int, nodes: int | None = None, timeout_s: float, resume: bool = True,
               checkpoint_dir: Path | None = None, checkpoint_at: tuple[int, ...] = (), max_tokens: int | None = None,
               faults: tuple[Fault, ...] = (), label: str = "", train: dict[str, Any] | None = None,
               interrupt: dict[str, Any] | None = None, watchdog: WatchdogPolicy | None = None) -> AttemptOutcome:
        """Run one attempt of the trainer to `steps` on `nodes` active nodes and return its outcome.

        `resume`: continue from the newest complete checkpoint in `checkpoint_dir` (default:
        the stage's). `train`: overrides of the spec's trainer section for this attempt.
        `interrupt`: {"after_step": S, "signal": "SIGKILL"|"SIGTERM"}: the supervisor sends
        the signal to the whole job once step S is reported (a deliberate interruption).
        """
        self.engine.check_cancel()
        n = nodes or self.spec.site.nodes
        ckpt = checkpoint_dir or self.stage_dir / "checkpoints"
        with self.ledger.session() as s:
            run = s.get(StageRun, self.run.id)
            assert run is not None
            a = q.create_attempt(s, run, nodes=[], ranks_per_node=self.spec.site.ranks_per_node, run_dir="",
                                 label=label, tokens_base=_tokens_base(run, resume))
            a.run_dir = str(self.stage_dir / f"attempt-{a.number:03d}")
            number, attempt_id = a.number, a.id
            excluded = sorted({e.node for e in q.list_exclusions(s, self.engine.site_name)})
        run_dir = self.stage_dir / f"attempt-{number:03d}"
        run_dir.mkdir(parents=True, exist_ok=True)
        trainer = self.spec.trainer.model_copy(update=train or {})
        config = TrainerConfig(
            model=self.spec.model, data=self.spec.data, train=trainer, faults=list(faults),
            run=RunConfig(max_steps=steps, max_tokens=max_tokens, checkpoint_dir=str(ckpt),
                          checkpoint_at=list(checkpoint_at), resume=resume, attempt=number),
        )
        request = self.engine.attempt_request(run_dir, config, n, excluded, timeout_s, bool(faults), number)
        request.update(interrupt=interrupt, watchdog=(watchdog or WatchdogPolicy()).model_dump())
        self.engine.progress.attempt_started(self.run.name, number, n, steps, label)
        self.engine.current_run_dir = run_dir
        rep, offset = self._supervise(request, attempt_id, run_dir, steps)
        if rep.get("short_of_nodes") and self.engine.renew_block(excluded):
            # The block has too few usable nodes left (spares spent): a new block, then again.
            rep, offset = self._supervise(request, attempt_id, run_dir, steps)
        elif rep.get("block_failed") and self.engine.restart_block(rep["error"]):
            # Parsl gives up on an executor whose block never started; a fresh load, then again.
            rep, offset = self._supervise(request, attempt_id, run_dir, steps)
        self.engine.current_run_dir = None
        self._ingest(attempt_id, run_dir, offset, steps)
        return self._finish(attempt_id, number, run_dir, rep, ckpt)

    def _supervise(self, request: dict[str, Any], attempt_id: int, run_dir: Path, steps: int
                   ) -> tuple[dict[str, Any], int]:
        """Call the supervisor app and ingest metrics until it returns."""
        future = self._supervisor_app()(request)
        offset = 0
        while not future.done():
            time.sleep(INGEST_PERIOD_S / 4)
            offset = self._ingest(attempt_id, run_dir, offset, steps)
            if self.engine.cancel_requested:
                (run_dir / STOP_FILE).touch()
        try:
            return future.result(), offset
        except Exception as e:  # the app itself failed: its block ended, or a bug/serialization problem
            return _app_failure(e, run_dir), offset

    def _supervisor_app(self) -> Any:
        if self._app is None:
            from parsl import python_app

            from campaign.supervisor import supervise

            self._app = python_app(supervise, executors=[self.engine.site_label])
        return self._app

    def _ingest(self, attempt_id: int, run_dir: Path, offset: int, steps: int) -> int:
        rows, new_offset = report.read_metrics(run_dir, offset)
        if rows:
            with self.ledger.session() as s:
                a = s.get(Attempt, attempt_id)
                assert a is not None
                q.ingest_steps(s, a, rows)
            self.engine.progress.steps(self.run.name, rows[-1], steps)
        return new_offset

    def _finish(self, attempt_id: int, number: int, run_dir: Path, rep: dict[str, Any], ckpt: Path) -> AttemptOutcome:
        metrics, _ = report.read_metrics(run_dir)
        checkpoints = report.list_checkpoints(ckpt) if ckpt.exists() else []
        with self.ledger.session() as s:
            a = s.get(Attempt, attempt_id)
            assert a is not None
            a.nodes = list(rep.get("nodes") or [])
            for ck in checkpoints:
                q.record_checkpoint(s, a.stage_run, a, step=ck["step"], tokens=ck.get("tokens") or 0,
                                    path=str(ck["path"]), complete=bool(ck["complete"]))
            q.finish_attempt(s, a, state=rep["exit_class"], exit_code=rep["exit_code"],
                             suspects=rep.get("suspects", []), summary=_summary(rep))
        self.engine.progress.attempt_finished(self.run.name, number, rep)
        for st in rep.get("stragglers") or []:
            self.event("straggler", f"straggler {st['node']}: computes {st['ratio']:.1f}x as long per step as the "
                       f"other nodes' median ({st['compute_s'] * 1000:.0f} ms vs {st['others_median_s'] * 1000:.0f} ms)",
                       attempt_id=attempt_id, data=st)
        nodes = list(rep.get("nodes") or [])
        return AttemptOutcome(attempt_id, number, run_dir, nodes, len(nodes) * self.spec.site.ranks_per_node, rep,
                              metrics, report.read_startup(run_dir), checkpoints)


def _app_failure(e: Exception, run_dir: Path) -> dict[str, Any]:
    """The report of an attempt whose supervisor app never returned."""
    from parsl.executors.errors import BadStateException
    from parsl.executors.high_throughput.errors import ManagerLost, WorkerLost

    lost = isinstance(e, (ManagerLost, WorkerLost))
    unstarted = isinstance(e, BadStateException)  # the block's workers never registered
    metrics, _ = report.read_metrics(run_dir)
    what = ("the block failed to start its worker" if unstarted else "the block ended under the attempt" if lost
            else "supervisor app failed")
    return {"exit_code": 143 if lost or unstarted else 1,
            "exit_class": "block_lost" if lost or unstarted else "crashed_systemic",
            "block_failed": unstarted, "duration_s": 0.0, "nodes": [], "suspects": [], "killed_by": None,
            "last_step": metrics[-1]["step"] if metrics else None, "error": f"{what}: {str(e)[:2000]}"}


def _tokens_base(run: StageRun, resume: bool) -> int:
    """Stage tokens before a new attempt: a resuming attempt continues the chain of the
    newest earlier attempt (its cumulative tokens go on from the checkpoint); a fresh one
    adds to what the stage already trained."""
    if resume and run.attempts:
        return int(run.attempts[-1].tokens_base)
    return int(run.tokens)


def _summary(rep: dict[str, Any]) -> dict[str, Any]:
    keep = ("duration_s", "killed_by", "stall", "first_failure", "launch_command", "error", "detected_after_s",
            "spares", "allocation", "stragglers")
    return {k: rep.get(k) for k in keep if rep.get(k) not in (None, [])}


class Engine:
    """Drives one campaign through its stages; the only writer of its ledger rows."""

    def __init__(self, spec: CampaignSpec, ledger: Ledger, *, workdir: Path, progress: Progress | None = None,
                 spec_dir: Path | None = None) -> None:
        self.spec, self.ledger = spec, ledger
        self.spec_dir = (spec_dir or Path.cwd()).resolve()
        self.workdir = workdir.resolve()
        self.campaign_dir = self.workdir / spec.name
        self.progress = progress or Progress()
        self.site_label = "campaign"
        self.campaign_id: int | None = None
        self.cancel_requested = False
        self.current_run_dir: Path | None = None
        self._dfk: Any = None
        self._restarted = False

    # --- campaign -----------------------------------------------------------------------

    def register(self, source: str, *, new_version: bool = False) -> Campaign:
        """Find or create the campaign row; refuse a different spec under the same name."""
        digest = self.spec.digest()
        spec_json = json.loads(self.spec.canonical_json())
        with self.ledger.session() as s:
            c = q.get_campaign(s, self.spec.name)
            if c is None:
                c = q.create_campaign(s, name=self.spec.name, digest=digest, spec_json=spec_json, source=source,
                                      site=self.site_name, workdir=str(self.campaign_dir), spec_dir=str(self.spec_dir))
            elif c.spec_digest != digest:
                if not new_version:
                    raise CampaignConflict(
                        f"campaign {self.spec.name!r} already exists in the ledger with a different spec "
                        f"({c.spec_digest[:12]}, this file {digest[:12]}); rename the campaign, or run a new "
                        "version of it with: campaign submit FILE --new-version"
                    )
                q.bump_campaign_version(s, c, digest=digest, spec_json=spec_json, source=source)
            q.ensure_stage_runs(s, c, [(st.label, st.kind) for st in self.spec.stages])
            self.campaign_id = c.id
            return c

    @property
    def site_name(self) -> str:
        return self.spec.site.kind

    def submit(self, source: str = "", *, new_version: bool = False) -> int:
        """Run every stage not yet passed, in order. 0 if all passed, 1 if one failed, 130 if cancelled."""
        self.register(source, new_version=new_version)
        assert self.campaign_id is not None
        lease = DriverLease(self.ledger, self.campaign_id)
        lease.acquire()
        previous = self._install_signal_handlers()
        try:
            self.campaign_dir.mkdir(parents=True, exist_ok=True)
            reaped = reap_dead_driver(self.campaign_dir)
            if reaped:
                self.progress.event(f"stopped {reaped} Parsl process(es) a dead driver left running")
            self.recover_orphans()
            return self._drive()
        finally:
            self._restore_signal_handlers(previous)
            lease.release()

    def _drive(self) -> int:
        with self.ledger.session() as s:
            c = s.get(Campaign, self.campaign_id)
            assert c is not None
            runs = q.current_stage_runs(s, c)
            q.set_campaign_state(s, c, "running")
        self.progress.campaign_started(self.spec.name, self.ledger.display_url, len(runs))
        todo = [(r, st) for r, st in zip(runs, self.spec.stages) if r.state != "passed"]
        for run in runs:
            if run.state == "passed":
                self.progress.stage_skipped(run.name, "passed earlier")
        try:
            if todo:
                with self._parsl():
                    self._run_stages(todo)
        except Cancelled:
            return self._finish_campaign(cancelled=True)
        return self._finish_campaign()

    def _run_stages(self, todo: list[tuple[StageRun, StageSpec]]) -> None:
        failed: str | None = None
        for run, stage in todo:
            if failed is not None:
                self._set_stage(run, "skipped", f"not run: stage {failed} failed")
                continue
            verdict = self.run_stage(run, stage)
            if not verdict.passed and not stage.continue_on_failure:
                failed = run.name

    @contextlib.contextmanager
    def _parsl(self) -> Iterator[None]:
        """One Parsl DataFlowKernel (and one block) for the stages of this submission; a fresh
        Config each time, as Parsl requires; `renew_block` may replace it in between."""
        self._load_parsl(self.spec.site)
        try:
            yield
        finally:
            self._unload_parsl()

    def _load_parsl(self, site: Any) -> None:
        import parsl

        from campaign import executors

        self._dfk = parsl.load(executors.module(site.kind).parsl_config(site, self.campaign_dir / "parsl"))
        proc = getattr(self._dfk.executors.get(self.site_label), "interchange_proc", None)
        report.write_json_atomic(self.campaign_dir / DRIVER_FILE, {
            "host": socket.gethostname(), "pid": os.getpid(), "interchange_pid": proc.pid if proc else None,
            "parsl_dir": str(self.campaign_dir / "parsl")})

    def _unload_parsl(self) -> None:
        import parsl

        if self._dfk is not None:
            self._dfk.cleanup()
            self._dfk = None
            parsl.clear()

    def restart_block(self, why: str) -> bool:
        """A fresh Parsl load of the same site after its block failed to start (once per submission)."""
        if self._dfk is None or self._restarted:
            return False
        self._restarted = True
        message = f"the block failed to start; loading Parsl again for a new block ({why.splitlines()[0][:200]})"
        with self.ledger.session() as s:
            c = s.get(Campaign, self.campaign_id)
            assert c is not None
            q.add_event(s, c, "block_restarted", message)
        self.progress.event(message)
        self._unload_parsl()
        self._load_parsl(self.spec.site)
        return True

    def renew_block(self, excluded: list[str]) -> bool:
        """Replace the block by a new one that can still provide the stage's nodes (batch sites:
        the spares are spent). False where no new block can help (the local site)."""
        from campaign import executors

        site = self.spec.site
        if site.node_names() is not None or self._dfk is None:
            return False
        module = executors.module(site.kind)
        renewed = getattr(module, "renewed", None)
        new_site = renewed(site, excluded) if renewed else site.model_copy(update={"spares": site.spares + len(excluded)})
        message = (f"spares spent ({len(excluded)} node(s) excluded): asking the provider for a new block of "
                   f"{new_site.block_nodes} node(s)")
        with self.ledger.session() as s:
            c = s.get(Campaign, self.campaign_id)
            assert c is not None
            q.add_event(s, c, "block_renewed", message, data={"excluded": excluded})
        self.progress.event(message)
        self._unload_parsl()
        self._load_parsl(new_site)
        return True

    def run_stage(self, run: StageRun, stage: StageSpec) -> Verdict:
        self._set_stage(run, "running")
        self.progress.stage_started(run.name, stage.kind, run.position, len(self.spec.stages))
        try:
            verdict = stages.module(stage.kind).run(StageContext(self, run, stage), stage)
        except Cancelled:
            self._set_stage(run, "failed", "cancelled by the user")
            raise
        except Exception as e:
            verdict = Verdict(False, f"stage crashed in the orchestrator: {type(e).__name__}: {e}",
                              {"traceback": traceback.format_exc(limit=5)})
        if self.cancel_requested:
            self._set_stage(run, "failed", "cancelled by the user")
            raise Cancelled()
        self._set_stage(run, "passed" if verdict.passed else "failed", verdict.reason, verdict.numbers)
        self.progress.stage_finished(run.name, verdict)
        return verdict

    def _set_stage(self, run: StageRun, state: str, verdict: str | None = None,
                   numbers: dict[str, Any] | None = None) -> None:
        with self.ledger.session() as s:
            r = s.get(StageRun, run.id)
            assert r is not None
            q.set_stage_state(s, r, state, verdict=verdict, numbers=numbers)
        run.state = state

    def _finish_campaign(self, *, cancelled: bool = False) -> int:
        with self.ledger.session() as s:
            c = s.get(Campaign, self.campaign_id)
            assert c is not None
            runs = q.current_stage_runs(s, c)
            ok = all(r.state == "passed" or (r.state == "failed" and self.spec.stage(r.name).continue_on_failure)
                     for r in runs)
            state = "cancelled" if cancelled else "succeeded" if ok else "failed"
            q.set_campaign_state(s, c, state)
            summary = q.summarize_campaign(s, c)
        self.progress.campaign_finished(summary)
        return EXIT_CANCELLED if cancelled else 0 if ok else 1

    # --- cancel and crash recovery --------------------------------------------------------

    def _install_signal_handlers(self) -> dict[int, Any]:
        def request_cancel(signum: int, _frame: Any) -> None:
            if not self.cancel_requested:
                self.cancel_requested = True
                self.progress.event(f"{signal.Signals(signum).name} received: stopping the running attempt, "
                                    "recording the campaign as cancelled")
            if self.current_run_dir is not None:
                (self.current_run_dir / STOP_FILE).touch()

        previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                previous[sig] = signal.signal(sig, request_cancel)
            except ValueError:  # not the main thread (e.g. a test harness): no handlers
                break
        return previous

    @staticmethod
    def _restore_signal_handlers(previous: dict[int, Any]) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def check_cancel(self) -> None:
        if self.cancel_requested:
            raise Cancelled()

    def recover_orphans(self) -> None:
        """Attempts a crashed driver left open: stop their jobs, mark them `orphaned`."""
        with self.ledger.session() as s:
            c = s.get(Campaign, self.campaign_id)
            assert c is not None
            for a in q.list_open_attempts(s, c):
                stopped = stop_orphan(Path(a.run_dir), self.spec.site)
                q.finish_attempt(s, a, state="orphaned", exit_code=None, suspects=[],
                                 summary={**(a.summary or {}), "recovery": stopped})
                q.add_event(s, c, "attempt_orphaned", f"stage {a.stage_run.name} attempt {a.number} was left running "
                            f"by a driver that died; {stopped}", stage_run=a.stage_run, attempt=a)
                if a.stage_run.state == "running":
                    a.stage_run.state = "pending"
                self.progress.event(f"recovered stage {a.stage_run.name} attempt {a.number}: {stopped}")

    # --- requests -------------------------------------------------------------------------

    def attempt_request(self, run_dir: Path, config: TrainerConfig, nodes: int, excluded: list[str],
                        timeout_s: float, faults: bool, attempt: int) -> dict[str, Any]:
        """The supervisor's instructions for one attempt (plain JSON-able data)."""
        config_path = run_dir / "trainer.json"
        config_path.write_text(config.model_dump_json(indent=2))
        command = self.spec.trainer.command or ["{python}", "-m", "campaign.train"]
        env = {
            "CAMPAIGN_RUN_DIR": str(run_dir),
            "CAMPAIGN_HOSTFILE": str(run_dir / "hostfile"),
            "CAMPAIGN_ATTEMPT": str(attempt),
            "CAMPAIGN_TRAINER_CONFIG": str(config_path),
            "CAMPAIGN_HEARTBEAT_INTERVAL": "1.0",
            "PYTHONUNBUFFERED": "1",
        }
        if faults:
            env["CAMPAIGN_ALLOW_FAULTS"] = "1"
        site = self.spec.site
        launch = site.launch_options()
        env.update(launch.pop("env", {}))
        return {
            "run_dir": str(run_dir),
            "allocation": site.node_names(),
            "exclude": excluded,
            "nodes": nodes,
            "ranks_per_node": site.ranks_per_node,
            "launcher": site.launcher,
            "argv": [*command, "--config", str(config_path)],
            "env": env,
            "hostfile": str(run_dir / "hostfile"),
            "config_path": str(config_path),
            "master_port": free_port(),
            "timeout_s": timeout_s,
            "block_walltime_s": getattr(site, "walltime_s", None),
            "deadline_from": getattr(site, "deadline_from", "block"),
            "launch": launch,
        }


def reap_dead_driver(campaign_dir: Path) -> int:
    """Stop the Parsl interchange and local block processes of a driver that died (kill -9):
    they outlive it. Only on the same host, only if that driver is gone, only processes that
    are provably its own (the interchange's pid and title; workers naming its Parsl directory)."""
    try:
        info = json.loads((campaign_dir / DRIVER_FILE).read_text())
    except (OSError, ValueError):
        return 0
    if info.get("host") != socket.gethostname() or info.get("pid") == os.getpid() or process_alive(int(info["pid"])):
        return 0
    victims = set()
    ipid = info.get("interchange_pid")
    if ipid and b"interchange" in _cmdline(int(ipid)):
        victims.add(int(ipid))
    marker = str(info.get("parsl_dir", "")).encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and marker and marker in _cmdline(int(proc.name)) and int(proc.name) != os.getpid():
            victims.add(int(proc.name))
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(victims)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def stop_orphan(run_dir: Path, site: Any) -> str:
    """Stop the job of an attempt whose driver died. Returns what was done, for the record."""
    (run_dir / STOP_FILE).touch()  # a supervisor that still lives stops its job
    try:
        pids = json.loads((run_dir / PIDS_FILE).read_text())
    except (OSError, ValueError):
        return "no job had started"
    if pids.get("block_job_id"):
        from campaign import executors

        cancel = getattr(executors.module(site.kind), "cancel_jobs", None)
        if cancel is not None:
            cancel(site, [pids["block_job_id"]])
            return f"cancelled scheduler job {pids['block_job_id']} through the provider"
    if pids.get("host") != socket.gethostname():
        return f"job ran on {pids.get('host')}; STOP file written for its supervisor"
    killed = [pgid for pgid in pids.get("pgids", []) if _kill_group(pgid, run_dir)]
    return f"killed {len(killed)} process group(s)" if killed else "its processes had already exited"


def _kill_group(pgid: int, run_dir: Path) -> bool:
    """SIGKILL process group `pgid` if its members are this attempt's (checked by environment)."""
    members = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) != pgid:
                continue
            env = (proc / "environ").read_bytes()
        except (OSError, ProcessLookupError):
            continue
        if f"CAMPAIGN_RUN_DIR={run_dir}".encode() in env:
            members.append(int(proc.name))
    if not members:
        return False
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True

