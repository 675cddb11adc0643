"""The engine: runs a campaign's stages in order, through Parsl, recording everything.

    engine = Engine(spec, ledger, workdir=Path("campaigns"))
    code = engine.submit(source_text)    # 0 all passed, 1 a stage failed

For each stage not yet passed: load a fresh Parsl config of the site, hand the stage
module a `StageContext`, and let it ask for attempts (`ctx.launch(...)`). An attempt is
one call of the supervisor app; while it runs, the engine ingests the attempt's
`metrics.jsonl` into the ledger and shows progress. Only this process writes the ledger.
"""

from __future__ import annotations

import json
import socket
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from campaign import reference, report, stages
from campaign.errors import CampaignConflict
from campaign.ledger import Ledger
from campaign.ledger import queries as q
from campaign.ledger.models import Attempt, Campaign, StageRun
from campaign.progress import Progress
from campaign.reference import Reference
from campaign.spec import CampaignSpec
from campaign.stagebase import StageSpec, Verdict
from campaign.train.config import Fault, RunConfig, TrainerConfig

INGEST_PERIOD_S = 1.0
"""How often a running attempt's metrics are ingested (one transaction each time)."""


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
    def losses(self) -> dict[int, float]:
        return {int(m["step"]): m["loss"] for m in self.metrics}

    def as_dict(self) -> dict[str, Any]:
        return {**self.report, "metrics": self.metrics, "startup": self.startup, "world_size": self.world_size,
                "checkpoints": self.checkpoints}


class StageContext:
    """What a stage module may do: launch attempts and read the campaign's spec and ledger."""

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

    def launch(self, *, steps: int, nodes: int | None = None, timeout_s: float, resume: bool = True,
               checkpoint_dir: Path | None = None, checkpoint_at: tuple[int, ...] = (), max_tokens: int | None = None,
               faults: tuple[Fault, ...] = (), label: str = "", train: dict[str, Any] | None = None,
               interrupt: dict[str, Any] | None = None) -> AttemptOutcome:
        """Run one attempt of the trainer to `steps` on `nodes` active nodes and return its outcome.

        `resume`: continue from the newest complete checkpoint in `checkpoint_dir` (default:
        the stage's). `train`: overrides of the spec's trainer section for this attempt.
        `interrupt`: {"after_step": S, "signal": "SIGKILL"|"SIGTERM"}: the supervisor sends
        the signal to the whole job once step S is reported (a deliberate interruption).
        """
        site = self.spec.site
        n = nodes or site.nodes
        hosts = self.engine.pick_nodes(n)
        ckpt = checkpoint_dir or self.stage_dir / "checkpoints"
        with self.ledger.session() as s:
            run = s.get(StageRun, self.run.id)
            assert run is not None
            base = _tokens_base(run, resume)
            a = q.create_attempt(s, run, nodes=hosts, ranks_per_node=site.ranks_per_node, run_dir="",
                                 label=label, tokens_base=base)
            a.run_dir = str(self.stage_dir / f"attempt-{a.number:03d}")
            number, attempt_id = a.number, a.id
        run_dir = Path(self.stage_dir / f"attempt-{number:03d}")
        run_dir.mkdir(parents=True, exist_ok=True)
        trainer = self.spec.trainer.model_copy(update=train or {})
        config = TrainerConfig(
            model=self.spec.model, data=self.spec.data, train=trainer, faults=list(faults),
            run=RunConfig(max_steps=steps, max_tokens=max_tokens, checkpoint_dir=str(ckpt),
                          checkpoint_at=list(checkpoint_at), resume=resume, attempt=number),
        )
        request = self.engine.attempt_request(run_dir, hosts, config, timeout_s, bool(faults), number)
        request["interrupt"] = interrupt
        self.engine.progress.attempt_started(self.run.name, number, hosts, steps, label)
        future = self._supervisor_app()(request)
        offset = 0
        while not future.done():
            time.sleep(INGEST_PERIOD_S / 4)
            offset = self._ingest(attempt_id, run_dir, offset, steps)
        try:
            rep = future.result()
        except Exception as e:  # the app itself failed (worker lost, serialization): no trainer verdict
            rep = {"exit_code": 1, "exit_class": "crashed_systemic", "duration_s": 0.0, "nodes": hosts,
                   "suspects": [], "killed_by": None, "error": f"supervisor app failed: {e!r}"}
        self._ingest(attempt_id, run_dir, offset, steps)
        return self._finish(attempt_id, number, run_dir, hosts, rep, ckpt)

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

    def _finish(self, attempt_id: int, number: int, run_dir: Path, hosts: list[str], rep: dict[str, Any],
                ckpt: Path) -> AttemptOutcome:
        metrics, _ = report.read_metrics(run_dir)
        checkpoints = report.list_checkpoints(ckpt) if ckpt.exists() else []
        with self.ledger.session() as s:
            a = s.get(Attempt, attempt_id)
            assert a is not None
            for ck in checkpoints:
                q.record_checkpoint(s, a.stage_run, a, step=ck["step"], tokens=ck.get("tokens") or 0,
                                    path=str(ck["path"]), complete=bool(ck["complete"]))
            q.finish_attempt(s, a, state=rep["exit_class"], exit_code=rep["exit_code"],
                             suspects=rep.get("suspects", []), summary=_summary(rep))
        self.engine.progress.attempt_finished(self.run.name, number, rep)
        return AttemptOutcome(attempt_id, number, run_dir, hosts, len(hosts) * self.spec.site.ranks_per_node, rep,
                              metrics, report.read_startup(run_dir), checkpoints)


def _tokens_base(run: StageRun, resume: bool) -> int:
    """Stage tokens before a new attempt: a resuming attempt continues the chain of the
    newest earlier attempt (its cumulative tokens go on from the checkpoint); a fresh one
    adds to what the stage already trained."""
    if resume and run.attempts:
        return int(run.attempts[-1].tokens_base)
    return int(run.tokens)


def _summary(rep: dict[str, Any]) -> dict[str, Any]:
    keep = ("duration_s", "killed_by", "first_failure", "launch_command", "error")
    return {k: rep.get(k) for k in keep if rep.get(k) is not None}


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

    # --- campaign -----------------------------------------------------------------------

    def register(self, source: str, *, new_version: bool = False) -> Campaign:
        """Find or create the campaign row; refuse a different spec under the same name."""
        digest = self.spec.digest()
        spec_json = json.loads(self.spec.canonical_json())
        with self.ledger.session() as s:
            c = q.get_campaign(s, self.spec.name)
            if c is None:
                c = q.create_campaign(s, name=self.spec.name, digest=digest, spec_json=spec_json, source=source,
                                      site=self.site_name, workdir=str(self.campaign_dir))
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
        """Run every stage not yet passed, in order. Returns 0 if all passed, 1 otherwise."""
        self.register(source, new_version=new_version)
        self.campaign_dir.mkdir(parents=True, exist_ok=True)
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
        if todo:
            with self._parsl():
                self._run_stages(todo)
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

    def _parsl(self) -> Any:
        """One Parsl DataFlowKernel (and one block) for the stages of this submission; a fresh
        Config each time, as Parsl requires."""
        import parsl

        from campaign import executors

        site_module = executors.module(self.spec.site.kind)
        return parsl.load(site_module.parsl_config(self.spec.site, self.campaign_dir / "parsl"))

    def run_stage(self, run: StageRun, stage: StageSpec) -> Verdict:
        self._set_stage(run, "running")
        self.progress.stage_started(run.name, stage.kind, run.position, len(self.spec.stages))
        try:
            verdict = stages.module(stage.kind).run(StageContext(self, run, stage), stage)
        except Exception as e:
            verdict = Verdict(False, f"stage crashed in the orchestrator: {type(e).__name__}: {e}",
                              {"traceback": traceback.format_exc(limit=5)})
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

    def _finish_campaign(self) -> int:
        with self.ledger.session() as s:
            c = s.get(Campaign, self.campaign_id)
            assert c is not None
            runs = q.current_stage_runs(s, c)
            ok = all(r.state == "passed" or (r.state == "failed" and self.spec.stage(r.name).continue_on_failure)
                     for r in runs)
            q.set_campaign_state(s, c, "succeeded" if ok else "failed")
            summary = q.summarize_campaign(s, c)
        self.progress.campaign_finished(summary)
        return 0 if ok else 1

    # --- nodes and requests -------------------------------------------------------------

    def pick_nodes(self, n: int) -> list[str]:
        """The first `n` nodes of the allocation that the ledger does not exclude."""
        from campaign.errors import SiteError

        with self.ledger.session() as s:
            excluded = {e.node for e in q.list_exclusions(s, self.site_name)}
        usable = [h for h in self.spec.site.node_names() if h not in excluded]
        if len(usable) < n:
            raise SiteError(f"{n} nodes asked, but only {len(usable)} of the site's {self.spec.site.nodes} are usable "
                            f"({len(excluded)} excluded: {', '.join(sorted(excluded))}); lift exclusions with "
                            "`campaign nodes include NODE` or add nodes")
        return usable[:n]

    def attempt_request(self, run_dir: Path, hosts: list[str], config: TrainerConfig, timeout_s: float,
                        faults: bool, attempt: int) -> dict[str, Any]:
        config_path = run_dir / "trainer.json"
        config_path.write_text(config.model_dump_json(indent=2))
        hostfile = run_dir / "hostfile"
        hostfile.write_text("".join(f"{h}\n" for h in hosts))
        command = self.spec.trainer.command or ["{python}", "-m", "campaign.train"]
        env = {
            "CAMPAIGN_RUN_DIR": str(run_dir),
            "CAMPAIGN_HOSTFILE": str(hostfile),
            "CAMPAIGN_ATTEMPT": str(attempt),
            "CAMPAIGN_TRAINER_CONFIG": str(config_path),
            "CAMPAIGN_HEARTBEAT_INTERVAL": "1.0",
            "PYTHONUNBUFFERED": "1",
        }
        if faults:
            env["CAMPAIGN_ALLOW_FAULTS"] = "1"
        return {
            "run_dir": str(run_dir),
            "hosts": hosts,
            "ranks_per_node": self.spec.site.ranks_per_node,
            "launcher": self.spec.site.launcher,
            "argv": [*command, "--config", str(config_path)],
            "env": env,
            "hostfile": str(hostfile),
            "master_port": _free_port(),
            "timeout_s": timeout_s,
        }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
