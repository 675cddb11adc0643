"""One attempt as data: what the supervisor is asked to run (`AttemptRequest`), the one
launch plan built from it, the trainer config it carries (`trainer_config`), and the report
that comes back (`AttemptReport`).

    request = build_request(site, command, run_dir=..., nodes=2, excluded=[], timeout_s=600, ...)
    plan = request.launch_plan(hosts)        # the supervisor, the bisection drill and --dry-run
    launchers.render(request.launcher, plan) # exactly what will run, as text

`build_request` is a pure function of the spec's site and trainer command; it is the only
place that decides the trainer's argv and environment, so `campaign submit --dry-run`
shows exactly what the supervisor will start (paths and the rendezvous port aside).
A stage module asks its `StageContext` (`campaign.stagecontext`) for attempts; the engine
runs each through its attempt runner (`campaign.runner`; the Parsl app by default).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from campaign import contract, rundir
from campaign.stagebase import StrictModel, validated_copy
from campaign.train.config import CheckpointLayout, TrainConfig
from campaign.watchdog import WatchdogPolicy

if TYPE_CHECKING:
    from campaign.executors.base import Site
    from campaign.executors.launchers import LaunchPlan
    from campaign.spec import CampaignSpec
    from campaign.stagebase import Targets
    from campaign.train.config import Fault, TrainerConfig

HEARTBEAT_INTERVAL_S = 1.0
"""How often each node's local rank 0 rewrites its heartbeat file."""


@dataclass
class AttemptReport:
    """What one attempt did, as the supervisor saw it: it sends this as a plain dict
    (`to_dict`, JSON-able: also supervisor.json); the driver reads it back typed (`from_dict`)
    and hands it to the stage in its `AttemptOutcome`."""

    exit_code: int
    exit_class: str
    duration_s: float
    nodes: list[str]
    allocation: list[str] = field(default_factory=list)
    spares: list[str] = field(default_factory=list)
    killed_by: str | None = None
    stall: str | None = None
    first_failure: dict[str, Any] | None = None
    suspects: list[dict[str, Any]] = field(default_factory=list)
    last_step: int | None = None
    launch_command: list[str] = field(default_factory=list)
    launch_text: str | None = None
    error: str | None = None
    detected_after_s: float | None = None
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    short_of_nodes: bool = False
    finding: dict[str, Any] | None = None
    """What the evidence says of a crash (`campaign.evidence.Finding`): node, systemic or unknown."""
    rescue: dict[str, Any] | None = None
    """The rescue checkpoint asked for after the fault (`rescue.json`: saved, step, rank, seconds or why not)."""
    block_failed: bool = False
    """Set by the driver, never by the supervisor: the block never started its worker, or the
    driver lost its runner under the attempt (`campaign.stagecontext`): a fresh Parsl load may help."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> AttemptReport:
        """The report a supervisor sent. A key this release does not know is an error (no
        report comes back with keys on the side); a missing one takes its default."""
        known = {f.name for f in dataclasses.fields(cls)}
        extra = sorted(set(doc) - known)
        if extra:
            raise ValueError(f"an attempt report with unknown key(s) {', '.join(extra)}: the supervisor on the block "
                             "runs another release of campaign than the driver")
        return cls(**doc)


LAUNCH_FAILED = "the launch command could not start"
"""How the supervisor's report begins when the launcher or trainer program cannot be executed."""
_NOT_FOUND = re.compile(r"(?:^|[\s:'\"/])([\w.+-]+): (?:command )?not found|([\w.+-]+): No such file or directory")
_REJECTED = re.compile(r"Submit command .*? failed; [^\n]*?stderr=([^\n]*)")
_EXEC_FAILED = re.compile(r"execvp error on file (?P<hydra>\S+)|execve\(\): (?P<slurm>[^:]+): ")
"""A launcher that started but could not exec the program on a node: MPICH Hydra's proxy
("HYDU_create_process (...): execvp error on file PROG (No such file or directory)", then exit
255: seen with mpiexec 4.x) and slurmstepd ("error: execve(): PROG: No such file or directory")."""


def no_rank_started(rep: AttemptReport, *, ranks_wrote: bool) -> str | None:
    """Why no rank of the attempt ever started, or None when one may have. `ranks_wrote`: a rank
    left a trace (startup.json, a metrics row, a heartbeat). Such an attempt has nothing to
    judge: its stage fails with this reason, never with "0 ranks returned None".

    The shapes: the block never started its worker even after a fresh load (`block_failed`),
    or its submission failed (the scheduler command is missing, the job was rejected: Parsl's
    "Failed to start block ..."), too few usable nodes even after
    a new block (`short_of_nodes`), a launch command the supervisor could not execute
    (`LAUNCH_FAILED`: the launcher or the trainer's program not found), or a launcher that
    could not exec the program on the nodes (`_EXEC_FAILED`)."""
    error = " ".join((rep.error or "").split())
    # The block's submission failed: Parsl's "Failed to start block" (the block never started
    # its worker), seen either as the app's error or as the job's FAILED state (`Block.ended`).
    submit_failed = not rep.nodes and ("Failed to start block" in error or _REJECTED.search(rep.error or ""))
    if rep.block_failed or submit_failed:
        rejected = _REJECTED.search(rep.error or "")
        said = " ".join(rejected.group(1).split()) if rejected else ""  # the scheduler command's stderr
        missing = _NOT_FOUND.search(said or error)
        if missing:
            return f"{missing.group(1) or missing.group(2)} not found on the driver's host ({_cut(said or error)})"
        if said:
            return f"the job was rejected: {_cut(said)}"
        return f"the block never started its worker: {_cut(error)}"
    if rep.short_of_nodes:
        return _cut(error)
    if error.startswith(LAUNCH_FAILED) and not ranks_wrote:  # the supervisor could not execute it at all
        return _cut(error)
    line = str((rep.finding or {}).get("last_error_line") or "")
    if not ranks_wrote and (exec_failed := _EXEC_FAILED.search(line)):  # the launcher ran; the program did not
        program = exec_failed.group("hydra") or exec_failed.group("slurm")
        return (f"the launcher could not start {program} on the nodes (it exited {rep.exit_code}): "
                f"{_cut(line.strip())}")
    # An exit 127 after the launch started is not this: the trainer's own "broken environment"
    # (the contract's 127) is a rank that started, and the stage calls it systemic.
    return None


def _cut(text: str, n: int = 400) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


class Interrupt(StrictModel):
    """A deliberate interruption (the resume test): once `after_step` is reported, the
    supervisor sends `signal` to the whole launch."""

    after_step: int = Field(ge=1)
    signal: Literal["SIGKILL", "SIGTERM"] = "SIGKILL"
    after_checkpoint: str | None = None
    """Also wait until this checkpoint directory is complete (an async save may still be
    writing it when `after_step` is reported)."""
    checkpoint_step: int | None = None
    """With a trainer's own layout (`AttemptRequest.checkpoint_layout`): wait instead for a
    complete checkpoint of this step or later (one whose name gives no step: saved during
    this attempt)."""
    give_up_step: int | None = None
    """Stop the run once this step is reported without that checkpoint (the trainer does not
    save where it was asked): the stage says so instead of waiting for the timeout."""


class RunTargets(StrictModel):
    """What the attempt's trainer must do, typed (`of` reads them from its trainer config). The
    ranks' CAMPAIGN_* target variables are made from these and nowhere else (`environment`);
    the supervisor can read them here instead of parsing the environment back."""

    max_step: int = Field(ge=1)
    """The last step to train, in campaign's numbering (the step of the last metrics row)."""
    first_step: Literal[0, 1] = 1
    """`trainer.first_step`: the trainer's own number of the first step (CAMPAIGN_MAX_STEPS is
    in its numbering: `trainers_max_step`)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Stop once this many tokens were trained (cumulative, all ranks)."""
    checkpoint_dir: str
    """The stage's checkpoint folder for this attempt."""
    checkpoint_every: int = Field(default=0, ge=0)
    """Save every this many steps (0: only at `checkpoint_at` and the end)."""
    checkpoint_at: list[int] = []
    """Extra steps at which to save."""
    resume: bool = False
    """Continue from the newest complete checkpoint in `checkpoint_dir`."""
    resume_from: str | None = None
    """The checkpoint it resumes from, when campaign found one."""
    spec_dir: str
    """The campaign file's folder (relative paths of the trainer's command are relative to it)."""

    @classmethod
    def of(cls, config: TrainerConfig, spec_dir: Path, resume_from: dict[str, Any] | None) -> RunTargets:
        run = config.run
        return cls(max_step=run.max_steps, first_step=config.train.first_step, max_tokens=run.max_tokens,
                   checkpoint_dir=run.checkpoint_dir, checkpoint_every=config.train.checkpoint_every,
                   checkpoint_at=list(run.checkpoint_at), resume=run.resume, spec_dir=str(spec_dir),
                   resume_from=str(resume_from["path"]) if resume_from is not None else None)

    @property
    def trainers_max_step(self) -> int:
        """`max_step` in the trainer's numbering: a trainer that counts from 0 stops at max_step - 1."""
        return self.max_step - (1 - self.first_step)

    def environment(self) -> dict[str, str]:
        """The targets as the ranks' environment variables (docs/trainer-contract.md)."""
        env = {
            "CAMPAIGN_MAX_STEPS": str(self.trainers_max_step), "CAMPAIGN_CHECKPOINT_DIR": self.checkpoint_dir,
            "CAMPAIGN_CHECKPOINT_EVERY": str(self.checkpoint_every), "CAMPAIGN_RESUME": str(int(self.resume)),
            "CAMPAIGN_SPEC_DIR": self.spec_dir,
        }
        if self.max_tokens is not None:
            env["CAMPAIGN_MAX_TOKENS"] = str(self.max_tokens)
        if self.checkpoint_at:
            env["CAMPAIGN_CHECKPOINT_AT"] = ",".join(map(str, self.checkpoint_at))
        if self.resume_from is not None:
            env["CAMPAIGN_RESUME_FROM"] = self.resume_from
        return env


class AttemptRequest(StrictModel):
    """The supervisor's instructions for one attempt: plain data that survives Parsl's
    serialization. Built by `build_request` only."""

    run_dir: str
    """The attempt's run directory (shared filesystem): hostfile, trainer.json, logs, metrics."""
    attempt: int
    """The attempt's number in its stage."""
    allocation: list[str] | None
    """The block's node names when the site knows them (local); None: read them from the scheduler."""
    exclude: list[str] = []
    """Nodes the ledger excludes on this site."""
    nodes: int = Field(ge=1)
    """Active nodes to launch on."""
    rotate: int = Field(default=0, ge=0)
    """Rotate the active nodes by this many places, so that ranks move to other nodes (the
    confirming retry of a failure without evidence: does it follow the node or the rank?)."""
    ranks_per_node: int = Field(ge=1)
    launcher: str
    """`local`, `pals`, `mpich`, `srun` or `torchrun` (executors.launchers)."""
    argv: list[str]
    """The trainer's command; `{python}` stands for the supervisor's interpreter."""
    progress_pattern: str | None = None
    """`trainer.step_pattern` of a trainer whose progress is read from rank 0's output
    (`progress: stdout`): the supervisor writes metrics.jsonl for it. None: the trainer writes it."""
    checkpoint_layout: CheckpointLayout | None = None
    """`trainer.checkpoints`: the trainer's own checkpoints (the supervisor notes the step of
    those whose name gives none, `contract.note_checkpoint_steps`)."""
    progress_first_step: int = 1
    """`trainer.first_step`: the printed step N is recorded as N + 1 - first_step."""
    resume_step: int | None = None
    """The step of the checkpoint the attempt resumes from (None: it starts afresh, or the
    checkpoint's step is not known): its first metrics row follows it (`runfiles.StepChain`)."""
    progress_tokens_per_step: int | None = None
    """With `progress_pattern` and no `tokens` group in it: one step's tokens from the spec's
    batch (`contract.stdout_tokens_per_step`); the row of step N counts N x this. None: 0."""
    targets: RunTargets | None = None
    """What the trainer must do; None in a request made by hand (tests): the trainer is told no targets."""
    env: dict[str, str]
    """Environment for every rank, on top of the launching process's own (`rank_environment`:
    where the attempt runs, its `targets`, the site's launch options)."""
    cpu_bind: str | None = None
    gpu_bind: str | None = None
    depth: int | None = None
    wrapper: list[str] = []
    master_port: int | None = None
    """Rendezvous port on the first active node (None: the launcher's default)."""
    timeout_s: float = Field(gt=0)
    """Hard limit of the attempt (the launch is killed past it)."""
    block_walltime_s: float | None = None
    """The block's walltime: the trainer's deadline to checkpoint and exit 143."""
    deadline_from: Literal["block", "attempt"] = "block"
    interrupt: Interrupt | None = None
    watchdog: WatchdogPolicy = WatchdogPolicy()
    measured_step_s: list[float] = []
    """Step times this stage already measured at this size (the ledger's, earlier attempts'
    steady steps, newest last): a relaunch's watchdog starts from them (`Watch.prior_step_times`)."""

    @property
    def hostfile(self) -> Path:
        return Path(self.run_dir) / rundir.HOSTFILE

    @property
    def config_path(self) -> Path:
        return Path(self.run_dir) / rundir.TRAINER_CONFIG

    def launch_plan(self, hosts: list[str], *, python: str | None = None) -> LaunchPlan:
        """The one launch plan of this attempt on `hosts` (rank order)."""
        from campaign.executors import launchers

        python = python or sys.executable
        return launchers.LaunchPlan(
            hosts=tuple(hosts), ranks_per_node=self.ranks_per_node,
            argv=tuple(python if a == "{python}" else a for a in self.argv),
            env=tuple(sorted(self.env.items())), hostfile=str(self.hostfile), master_port=self.master_port,
            # Only srun takes an exclusion list (the scheduler enforces it); other launchers get explicit hosts.
            exclude=tuple(sorted(set(self.exclude) - set(hosts))) if self.launcher == "srun" else (),
            cpu_bind=self.cpu_bind, gpu_bind=self.gpu_bind, depth=self.depth, wrapper=tuple(self.wrapper),
            taskfile=str(Path(self.run_dir) / rundir.SRUN_TASKS) if self.launcher == "srun" else None,
        )

    def for_drill(self, drill_dir: Path, master_port: int | None) -> AttemptRequest:
        """The same launch for a short collective drill in `drill_dir` (bisection)."""
        env = {**self.env, **_located(drill_dir)}
        argv = ["{python}", "-m", "campaign.train.drill", "--config", str(self.config_path)]
        return validated_copy(self, run_dir=str(drill_dir), env=env, argv=argv, master_port=master_port)


def build_request(site: Site, config: TrainerConfig, *, run_dir: Path, nodes: int, excluded: list[str],
                  timeout_s: float, master_port: int | None, spec_dir: Path,
                  resume_from: dict[str, Any] | None = None, interrupt: Interrupt | None = None,
                  watchdog: WatchdogPolicy | None = None) -> AttemptRequest:
    """The request of one attempt: a pure function of the site, the attempt's trainer config
    (`trainer_config`) and the checkpoint it resumes from (the trainer's argv: its command
    template, expanded, `campaign.contract`; its targets typed, `RunTargets`, and as the ranks'
    environment, `rank_environment`)."""
    config_path = run_dir / rundir.TRAINER_CONFIG
    targets = RunTargets.of(config, spec_dir, resume_from)
    options = site.launch_options()
    env = rank_environment(run_dir, config.run.attempt, site.ranks_per_node, targets, faults=bool(config.faults),
                           launch_env=options.env)
    values = contract.placeholder_values(config, run_dir=run_dir, config=config_path, hostfile=run_dir / rundir.HOSTFILE,
                                         spec_dir=spec_dir)
    return AttemptRequest(
        run_dir=str(run_dir), attempt=config.run.attempt, allocation=site.node_names(), exclude=sorted(excluded),
        nodes=nodes, ranks_per_node=site.ranks_per_node, launcher=site.launcher,
        argv=contract.command_line(config.train, values, spec_dir, resume_from, launcher=site.launcher),
        targets=targets, env=env,
        cpu_bind=options.cpu_bind, gpu_bind=options.gpu_bind, depth=options.depth, wrapper=list(options.wrapper),
        master_port=master_port, timeout_s=timeout_s, block_walltime_s=site.block_walltime_s(),
        deadline_from=site.deadline_from, interrupt=interrupt, watchdog=watchdog or WatchdogPolicy(),
        progress_pattern=config.train.step_pattern if config.train.progress == "stdout" else None,
        progress_first_step=config.train.first_step, checkpoint_layout=config.train.checkpoints,
        progress_tokens_per_step=contract.stdout_tokens_per_step(config, nodes * site.ranks_per_node),
        resume_step=resume_from.get("step") if resume_from is not None else None,
    )


def rank_environment(run_dir: Path, attempt: int, ranks_per_node: int, targets: RunTargets, *, faults: bool,
                     launch_env: dict[str, str]) -> dict[str, str]:
    """The environment of every rank of an attempt: the one place its CAMPAIGN_* variables are
    made (where it runs, its number, its `targets`), then the site's launch options' `launch_env`."""
    env = {
        **_located(run_dir),
        "CAMPAIGN_ATTEMPT": str(attempt),
        "CAMPAIGN_TRAINER_CONFIG": str(run_dir / rundir.TRAINER_CONFIG),
        "CAMPAIGN_HEARTBEAT_INTERVAL": str(HEARTBEAT_INTERVAL_S),
        # PALS in PMIx mode (Aurora) tells a rank no world size: it is hostfile nodes x this.
        "CAMPAIGN_RANKS_PER_NODE": str(ranks_per_node),
        "PYTHONUNBUFFERED": "1",
        **targets.environment(),
    }
    if faults:
        env["CAMPAIGN_ALLOW_FAULTS"] = "1"
    env.update(launch_env)
    return env


def _located(run_dir: Path) -> dict[str, str]:
    """Where the ranks of a launch in `run_dir` write (an attempt, or a bisection drill)."""
    return {"CAMPAIGN_RUN_DIR": str(run_dir), "CAMPAIGN_HOSTFILE": str(run_dir / rundir.HOSTFILE)}


def version_root(campaign_dir: Path, version: int) -> Path:
    """Where version `version` of a campaign keeps its stage directories (run directories and
    checkpoints): the campaign's folder for the first, `vN/` in it for later ones, so a new
    version never resumes an older one's checkpoints."""
    return campaign_dir if version == 1 else campaign_dir / f"v{version}"


def reachable(recorded: Path) -> bool:
    """Whether this host can work in a campaign folder the ledger recorded (a teammate's
    `--workdir` on a shared ledger, another login node): the folder, or the folder above it
    when the campaign's own was deleted (it is recreated then), exists and is writable."""
    where = recorded if recorded.is_dir() else recorded.parent
    return where.is_dir() and os.access(where, os.W_OK | os.X_OK)


def compile_cache_dir(train: TrainConfig, stage_dir: Path) -> str | None:
    """The campaign's torch.compile cache folder (beside its stage folders), for the built-in
    trainer with `compile` and `compile_cache` on; None otherwise (campaign.train.compile_cache)."""
    from campaign.train.compile_cache import FOLDER

    if train.command is not None or not (train.compile and train.compile_cache):
        return None
    return str(stage_dir.parent / FOLDER)


def trainer_config(spec: CampaignSpec, targets: Targets, *, stage_dir: Path, attempt: int,
                   faults: tuple[Fault, ...] = (), spec_dir: Path | None = None) -> TrainerConfig:
    """The trainer.json of one attempt: the spec's sections, the stage's overrides and targets.
    A relative `data.path` is relative to the campaign file's folder `spec_dir` (the trainer
    runs in the attempt's run directory, where it would name nothing)."""
    from campaign.train.config import RunConfig, TrainerConfig

    train = validated_copy(spec.trainer, **targets.train)  # the stage's overrides: a wrong one names its field
    if train.deterministic == "auto":  # exact where the stage compares bit for bit
        train = validated_copy(train, deterministic=targets.exact)
    data = spec.data
    if data.path and spec_dir is not None:
        data = validated_copy(data, path=str(contract.spec_path(data.path, spec_dir)))
    return TrainerConfig(
        model=spec.model, data=data, train=train, faults=list(faults),
        run=RunConfig(max_steps=targets.steps, max_tokens=targets.max_tokens,
                      checkpoint_dir=str(stage_dir / targets.checkpoints), checkpoint_at=list(targets.checkpoint_at),
                      checkpoint_final=targets.checkpoint_final, resume=targets.resume, attempt=attempt,
                      compile_cache_dir=compile_cache_dir(train, stage_dir),
                      # A rescue helps a stage that resumes; a bit-exact comparison wants its own checkpoints.
                      rescue=targets.resume and not targets.exact and contract.rescue(train, spec.site.launcher),
                      rescue_linger_s=contract.rescue_linger_s(spec.site.launcher)),
    )
