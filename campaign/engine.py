"""The engine: runs a campaign's stages in order, recording everything.

    engine = Engine(spec, ledger, workdir=Path("campaigns"))
    code = engine.submit(source_text)    # 0 all passed, 1 a stage failed, 130 cancelled

One submission: take the campaign's lease (one driver at a time), recover what a crashed
driver left (`campaign.recovery`), hold the site's block (`campaign.block`: Parsl's load,
renewal when the spares are spent, restart when a block never started, unload) for the
stages, and for each stage not yet passed hand its module a `StageContext`
(`campaign.stagecontext`); the stage asks for attempts, which run on the block: by default
the supervisor as a Parsl app on the site's executor; `runner=campaign.runner.run_in_thread`
runs it in this process without Parsl (fast tests). Only this process writes the ledger.
"""

from __future__ import annotations

import json
import signal
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from campaign import contract, goodput, observe, stages
from campaign.attempt import reachable, version_root
from campaign.block import Block
from campaign.errors import CampaignConflict, CampaignError, LeaseLost, LedgerError, WorkdirError
from campaign.lease import RELEASE_WAIT_S, DriverLease
from campaign.ledger import Ledger
from campaign.ledger import reads, writes
from campaign.ledger.models import Campaign, StageRun
from campaign.progress import Progress
from campaign.recovery import LaunchStillRunning, reap_dead_driver, recover_orphans
from campaign.rundir import write_stop
from campaign.runner import AttemptRunner
from campaign.spec import CampaignSpec, reread_digest
from campaign.stagebase import NoRankStarted, StageSpec, Verdict
from campaign.stagecontext import StageContext
from campaign.summary import summarize_campaign

EXIT_CANCELLED = 130
"""`campaign submit` exit code when the campaign was cancelled."""


CANCEL_RELEASE_S = 3.0
"""After a cancel, how long the driver retries releasing its lease through a ledger outage."""


class Cancelled(Exception):
    """The driver was asked to stop (SIGTERM/SIGINT, `campaign cancel`)."""


class Engine:
    """Drives one campaign through its stages; the only writer of its ledger rows."""

    def __init__(self, spec: CampaignSpec, ledger: Ledger, *, workdir: Path, progress: Progress | None = None,
                 spec_dir: Path | None = None, runner: AttemptRunner | None = None,
                 tensorboard: Path | None = None) -> None:
        """`runner`: how attempts run (default: the supervisor as a Parsl app on the site's
        block, which this engine then loads and renews; any other runner gets no Parsl).
        `tensorboard`: a folder for TensorBoard event files (`--tensorboard`; wins over the
        spec's `observe.tensorboard`)."""
        self.spec, self.ledger = spec, ledger
        self.spec_dir = (spec_dir or Path.cwd()).resolve()
        self.workdir = workdir.resolve()
        self.campaign_dir = self.workdir / spec.name
        self.run_root = self.campaign_dir
        self.progress = progress or Progress()
        self.block = Block(spec.site, self.campaign_dir, record=self.record_block_event, runner=runner,
                           warm=contract.warm_start(spec.trainer, spec.site.launcher))
        self.observer = observe.for_campaign(spec, self.campaign_dir, self.spec_dir, warn=self.progress.event,
                                             tensorboard=tensorboard)
        """Where steps and committed events go besides the ledger (`campaign.observe`; null if none)."""
        self.campaign_id: int | None = None
        self.cancel_requested = False
        self.current_run_dir: Path | None = None
        self.lease_lost: str | None = None
        self._outage_said = -1e9

    # --- campaign -----------------------------------------------------------------------

    def register(self, source: str, *, new_version: bool = False) -> Campaign:
        """Find or create the campaign row; refuse a different spec under the same name. Two
        drivers that create the same campaign at the same moment: the one that finds the other's
        row (IntegrityError on its own insert) looks again; the lease then picks one driver."""
        try:
            return self._register(source, new_version=new_version)
        except sa.exc.IntegrityError:
            return self._register(source, new_version=new_version)

    def _register(self, source: str, *, new_version: bool) -> Campaign:
        digest = self.spec.digest()
        spec_json = json.loads(self.spec.canonical_json())
        for unit in self.writes("registering the campaign"):
            with unit as s:
                c = self._register_in(s, source, digest, spec_json, new_version)
        return c

    def _register_in(self, s: Any, source: str, digest: str, spec_json: dict[str, Any], new_version: bool) -> Campaign:
        c = reads.get_campaign(s, self.spec.name)
        if c is None:
            c = writes.create_campaign(s, name=self.spec.name, digest=digest, spec_json=spec_json, source=source,
                                       site=self.site_name, workdir=str(self.campaign_dir), spec_dir=str(self.spec_dir))
        elif c.spec_digest != digest and reread_digest(c.spec_source, self.spec.name) == digest:
            # The same file, read by a release whose spec has more fields (at their defaults)
            # than the one that stored it: the same campaign, under this release's digest.
            writes.refresh_campaign_digest(s, c, digest=digest, spec_json=spec_json)
        elif c.spec_digest != digest:
            if not new_version:
                raise CampaignConflict(
                    f"campaign {self.spec.name!r} already exists in the ledger with a different spec "
                    f"({c.spec_digest[:12]}, this file {digest[:12]}); rename the campaign, or run a new "
                    "version of it with: campaign submit FILE --new-version"
                )
            writes.bump_campaign_version(s, c, digest=digest, spec_json=spec_json, source=source)
        if c.workdir and Path(c.workdir) != self.campaign_dir:
            self._work_in(Path(c.workdir))
        writes.ensure_stage_runs(s, c, [(st.resolved_name, st.kind) for st in self.spec.stages])
        self.campaign_id = c.id
        # Each version trains in its own directories: v2 must never resume v1's checkpoints.
        self.run_root = version_root(self.campaign_dir, c.version)
        return c

    def _work_in(self, recorded: Path) -> None:
        """The ledger says this campaign works in `recorded` (a teammate's `--workdir` on a shared
        ledger, another login node): its checkpoints and attempts are there, so continue there
        when this host reaches it (its folder, or the folder above it when the campaign's own
        was deleted: recreated then), else refuse naming it; never start over in a second folder."""
        here = self.campaign_dir
        if not reachable(recorded):
            raise WorkdirError(
                f"campaign {self.spec.name!r} works in {recorded} (recorded in the ledger), which this host cannot "
                f"reach or write; run it where that folder is, with --workdir {recorded.parent}: its checkpoints "
                f"are there (nothing was started in {here})")
        self.progress.event(f"campaign {self.spec.name} works in {recorded} (recorded in the ledger), not in {here}: "
                            "continuing there")
        self.workdir, self.campaign_dir = recorded.parent, recorded
        self.block.campaign_dir = recorded

    def _check_campaign_dir(self) -> None:
        """Before the ledger is written: the campaign's folder (WORKDIR/NAME) must be a folder of
        its own, not the SQLite ledger's file or one of its companions (`name: ledger.db`), nor
        any other file."""
        d, db = self.campaign_dir, self.ledger.sqlite_path
        name = self.spec.name
        if db is not None and d.parent == db.parent and (d.name == db.name or d.name.startswith((f"{db.name}-",
                                                                                                   f"{db.name}."))):
            raise CampaignError(f"name: {name!r} would put the campaign's run directories in {d}, the ledger's own "
                                f"file ({db.name} or a companion of it) in {d.parent}: choose another campaign name")
        if d.exists() and not d.is_dir():
            raise CampaignError(f"name: {name!r}: {d} is a file, not the campaign's folder: choose another campaign "
                                "name, or move that file")

    @property
    def site_name(self) -> str:
        return self.spec.site.kind

    def submit(self, source: str = "", *, new_version: bool = False) -> int:
        """Run every stage not yet passed, in order. 0 if all passed, 1 if one failed, 130 if cancelled."""
        self._check_campaign_dir()
        self.register(source, new_version=new_version)
        assert self.campaign_id is not None
        lease = DriverLease(self.ledger, self.campaign_id, on_lost=self._lease_lost)
        lease.acquire()
        self.ledger.keep_reserve()  # room for the last writes should the disk fill up (DiskFull)
        previous = self._install_signal_handlers()
        self.ledger.listeners.append(self.observer.events)  # every committed event, from here on
        try:
            self.campaign_dir.mkdir(parents=True, exist_ok=True)
            reaped = reap_dead_driver(self.campaign_dir)
            if reaped:
                self.progress.event(f"stopped {reaped} Parsl process(es) a dead driver left running")
            held = lease.took_over
            why = "was left running by a driver that died" if held is None or held["dead"] else (
                f"was left running by pid {held['pid']} on {held['host']}, whose lease this driver took over "
                f"(not renewed for {held['age_s']:.0f} s)")
            recover_orphans(self.ledger, self.campaign_id, self.spec.site, self.progress.event, why=why)
            return self._drive()
        except Cancelled:
            raise  # the user's own stop, not the driver giving up
        except Exception as e:  # the ledger gone past its budget, the work directory, the lease, a bug
            self.observer.events([observe.gave_up(self.spec.name, f"{type(e).__name__}: {e}")])
            raise
        finally:
            self.ledger.listeners.remove(self.observer.events)
            lease.release(wait_s=CANCEL_RELEASE_S if self.cancel_requested else RELEASE_WAIT_S)
            try:  # bounded waits (notify.wait_s, W&B's finish), under our handlers: a Ctrl-C cannot cut them short
                for line in self.observer.close():
                    self.progress.note(line)
            finally:
                self._restore_signal_handlers(previous)

    def _drive(self) -> int:
        for unit in self.writes("starting the campaign"):
            with unit as s:
                c = s.get(Campaign, self.campaign_id)
                assert c is not None
                runs = reads.current_stage_runs(s, c)
                writes.set_campaign_state(s, c, "running")
        self.progress.campaign_started(self.spec.name, self.ledger.display_url, len(runs))
        todo = [(r, st) for r, st in zip(runs, self.spec.stages) if r.state != "passed"]
        for run in runs:
            if run.state == "passed":
                self.progress.stage_skipped(run.name, "passed earlier")
        try:
            if todo:
                with self.block.loaded():
                    self._run_stages(todo)
        except WorkdirError as e:  # a full disk (DiskFull) or a work directory it cannot write
            self._record_stop(e)
            raise
        except Cancelled:
            try:
                return self._finish_campaign(cancelled=True)
            except Cancelled:  # the ledger does not answer: do not wait for it after a Ctrl-C
                self.progress.event(f"cancelled while the ledger does not answer: it still shows {self.spec.name} "
                                    f"running; `campaign resume {self.spec.name}` continues it")
                return EXIT_CANCELLED
        return self._finish_campaign()

    def _record_stop(self, e: WorkdirError) -> None:
        """Say in the ledger why the driver stops on a full disk or a work directory it cannot
        write: the running stage and the campaign `failed` with that reason (`campaign resume`
        continues them once there is room), with the ledger's reserve (`Ledger.closing`). With
        no room even so, they stay `running` until the next driver."""
        self.ledger.closing = True
        why = str(e).splitlines()[0]
        try:
            for unit in self.writes("recording why the driver stops"):
                with unit as s:
                    c = s.get(Campaign, self.campaign_id)
                    assert c is not None
                    for r in reads.current_stage_runs(s, c):
                        if r.state == "running":
                            writes.set_stage_state(s, r, "failed", verdict=f"stopped: {why}")
                    writes.set_campaign_state(s, c, "failed", f"the driver stopped: {why}")
        except CampaignError:
            pass

    def _run_stages(self, todo: list[tuple[StageRun, StageSpec]]) -> None:
        failed: str | None = None
        for run, stage in todo:
            if failed is not None:
                self._set_stage(run, "skipped", f"not run: stage {failed} failed")
                continue
            verdict = self.run_stage(run, stage)
            if not verdict.passed and not stage.continue_on_failure:
                failed = run.name

    # --- ledger writes that outlive an outage ----------------------------------------------

    def writes(self, what: str) -> Iterator[Any]:
        """Units of work for one ledger write, retried through an outage (`Ledger.retrying`)."""
        return self.ledger.retrying(what, warn=self.progress.event,
                                    interrupted=lambda: Cancelled() if self.cancel_requested else None)

    def ledger_unreachable(self, error: BaseException) -> None:
        """A write that can wait (metrics ingestion) found the ledger unreachable: say so once a minute."""
        now = time.monotonic()
        if now - self._outage_said > 60:
            self._outage_said = now
            self.progress.event(f"the ledger is not answering ({str(error).splitlines()[0][:160]}); the trainer "
                                "goes on and its metrics are ingested once it answers")

    # --- the block's events -----------------------------------------------------------------

    def record_block_event(self, kind: str, message: str, data: dict[str, Any] | None) -> None:
        """The block's `record`: its renewals and restarts, in the ledger and on the terminal."""
        for unit in self.writes(f"recording the event {kind}"):
            with unit as s:
                c = s.get(Campaign, self.campaign_id)
                assert c is not None
                writes.add_event(s, c, kind, message, data=data)
        self.progress.event(message)

    def run_stage(self, run: StageRun, stage: StageSpec) -> Verdict:
        self._set_stage(run, "running")
        self.progress.stage_started(run.name, stage.kind, run.position, len(self.spec.stages))
        try:
            verdict = stages.module(stage.kind).run(StageContext(self, run, stage), stage)
        except Cancelled:
            self._set_stage(run, "failed", "cancelled by the user")
            raise
        except LeaseLost:
            raise  # the ledger belongs to the new driver now: write nothing
        except (LedgerError, WorkdirError, LaunchStillRunning):
            raise  # not the stage's failure: the ledger, the work directory, an old launch elsewhere; resume continues
        except NoRankStarted as e:
            verdict = Verdict(False, f"no rank started: {e.why}", {"no_rank_started": True, "attempt": e.attempt})
        except Exception as e:
            where = self._keep_traceback(run.name)
            verdict = Verdict(False, f"stage crashed in the driver: {type(e).__name__}: {e} (traceback: {where})",
                              {"traceback": traceback.format_exc(limit=5), "traceback_file": where})
        if self.cancel_requested:
            self._set_stage(run, "failed", "cancelled by the user")
            raise Cancelled()
        self._set_stage(run, "passed" if verdict.passed else "failed", verdict.reason, verdict.numbers)
        self.progress.stage_finished(run.name, verdict)
        return verdict

    def _keep_traceback(self, stage: str) -> str:
        """Write the driver's whole traceback beside the stage's run directories; where it is
        (`campaign status NAME --json` holds its last 5 frames too)."""
        path = self.run_root / stage / "driver-traceback.txt"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(traceback.format_exc())
        except OSError as e:
            return f"not written ({e}); `campaign status {self.spec.name} --json`"
        return str(path)

    def _set_stage(self, run: StageRun, state: str, verdict: str | None = None,
                   numbers: dict[str, Any] | None = None) -> None:
        for unit in self.writes("recording the stage's state"):
            with unit as s:
                r = s.get(StageRun, run.id)
                assert r is not None
                writes.set_stage_state(s, r, state, verdict=verdict, numbers=numbers)
                goodput.record_stage(s, r)
        run.state = state

    def _finish_campaign(self, *, cancelled: bool = False) -> int:
        for unit in self.writes("recording the campaign's end"):
            with unit as s:
                c = s.get(Campaign, self.campaign_id)
                assert c is not None
                runs = reads.current_stage_runs(s, c)
                ok = all(r.state == "passed" or (r.state == "failed" and self.spec.stage(r.name).continue_on_failure)
                         for r in runs)
                state = "cancelled" if cancelled else "succeeded" if ok else "failed"
                writes.set_campaign_state(s, c, state)
                summary = summarize_campaign(s, c)
        self.progress.campaign_finished(summary)
        return EXIT_CANCELLED if cancelled else 0 if ok else 1

    # --- cancel ---------------------------------------------------------------------------

    def _install_signal_handlers(self) -> dict[int, Any]:
        def request_cancel(signum: int, _frame: Any) -> None:
            if not self.cancel_requested:
                self.cancel_requested = True
                self.progress.event(f"{signal.Signals(signum).name} received: stopping the running attempt, "
                                    "recording the campaign as cancelled")
            if self.current_run_dir is not None:
                write_stop(self.current_run_dir)

        previous = {}
        # SIGHUP (a closed ssh session, a dropped terminal) is a request to stop like SIGTERM:
        # stop the launch, record the campaign cancelled; `campaign resume` continues it.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
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
        """Between and during attempts: stop if cancelled, or if this driver lost its lease."""
        self.check_lease()
        if self.cancel_requested:
            raise Cancelled()

    def check_lease(self) -> None:
        if self.lease_lost is not None:
            raise LeaseLost(f"{self.lease_lost}; this driver stops and leaves the running launch to it")

    def _lease_lost(self, why: str) -> None:
        self.lease_lost = why
        self.progress.event(f"lost the lease: {why}; stopping without touching the launch")
