"""What the batch sites (`aurora`, `polaris`, `slurm`) share: the fields every one has,
walltime parsing, the Parsl `Config` around a provider, cancelling jobs, and the dry run
of a provider's submit path.

One block (one scheduler job) of `nodes + spares` nodes serves the stages of one
submission. Exactly one Parsl worker runs in it, on the head node (`SimpleLauncher`,
`max_workers_per_node=1`), so the supervisor app sees the job's `PBS_NODEFILE` /
`SLURM_JOB_NODELIST` and launches the trainer over the active nodes with the site's
launcher. Parsl's `simple` strategy starts a new block when the running one ends (its
walltime) while an attempt is still wanted: walltime chaining.

Not a site itself (it is not in `KINDS`). Parsl is imported inside functions only.
"""

from __future__ import annotations

import re
import shlex
import string
from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, field_validator

from campaign.errors import SiteError
from campaign.executors.base import LABEL, Site, interchange_command, parsl_scripts_dir

if TYPE_CHECKING:
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from parsl.providers.base import ExecutionProvider

IDLE_BLOCK_S = 300.0
"""An idle block (no attempt running) is released after this long."""
_WALLTIME = re.compile(r"^(\d{1,3}):([0-5]\d):([0-5]\d)$")


def walltime_seconds(text: str) -> int:
    """`HH:MM:SS` (hours may exceed 24) as seconds; ValueError otherwise."""
    m = _WALLTIME.match(text.strip())
    if m is None:
        raise ValueError(f"walltime must be HH:MM:SS (e.g. 06:00:00), got {text!r}")
    h, mi, s = (int(g) for g in m.groups())
    return h * 3600 + mi * 60 + s


class BatchSite(Site):
    """Fields every batch site has; a site module subclasses it with its `kind`, defaults and
    `provider()`; `parsl_config`, `cancel_jobs` and `dry_run` follow from the provider."""

    PREFERRED_INTERFACE: ClassVar[str | None] = None
    """Interface whose address workers connect to when the driver's host has it and neither
    `address` nor `address_interface` is set (else every address Parsl finds)."""

    nodes: int = Field(default=2, ge=1, le=20000)
    """Active nodes a stage may use (the default node count of every stage)."""
    spares: int = Field(default=0, ge=0, le=1000)
    """Extra nodes in the block: they replace excluded or failed nodes without a new job."""
    walltime: str = "01:00:00"
    """Walltime of one block (HH:MM:SS); stages still running at its end continue in a new block."""
    worker_init: str = ""
    """Shell commands run in the job before the Parsl worker starts: activate the environment
    that has `campaign` installed, e.g. `module load frameworks; source ~/venv/bin/activate`."""
    scheduler_options: str = ""
    """Extra scheduler directives, one per line (`#PBS ...` / `#SBATCH ...`)."""
    env: dict[str, str] = {}
    """Extra environment variables for every rank (e.g. `MASTER_ADDR: 127.0.0.1` when node
    names do not resolve)."""
    address: str | None = None
    """Address of this (login) node that workers connect to (default: every address Parsl finds)."""
    address_interface: str | None = None
    """Network interface whose address workers connect to (Parsl's `address_by_interface`),
    when `address` is not set; e.g. `bond0` on Polaris login nodes."""
    tmpdir: str | None = None
    """TMPDIR exported in the job before the Parsl worker starts (null: the scheduler's own)."""
    expected_tokens_per_s: float | None = Field(default=None, gt=0)
    """Throughput you expect at the site's node count; with a long run's token target it
    tells whether the block's walltime is enough (a warning before submitting)."""

    @field_validator("walltime")
    @classmethod
    def _walltime_format(cls, v: str) -> str:
        walltime_seconds(v)
        return v.strip()

    @property
    def walltime_s(self) -> int:
        """The block's walltime in seconds: the trainer's deadline."""
        return walltime_seconds(self.walltime)

    def block_walltime_s(self) -> float | None:
        return float(self.walltime_s)

    @property
    def block_nodes(self) -> int:
        """Nodes of one block: the active nodes and the spares."""
        return self.nodes + self.spares

    @abstractmethod
    def provider(self, cls: type | None = None) -> ExecutionProvider:
        """The site's Parsl provider (`cls`: a subclass of its class, for the dry run)."""

    @property
    @abstractmethod
    def dry_run_job_output(self) -> str:
        """What the scheduler's submit command prints, for the dry run's captured submit."""

    def parsl_config(self, run_dir: Path) -> Config:
        """A fresh Config: one block of nodes + spares, one worker on its head node."""
        return parsl_config(self, self.provider(), run_dir)

    def cancel_jobs(self, job_ids: list[str]) -> list[bool]:
        """qdel/scancel the jobs through the provider."""
        return cancel_jobs(self.provider(), job_ids)

    def dry_run(self, script_dir: Path) -> tuple[str, list[str]] | None:
        """(batch script, submit command) of the first block; nothing is submitted or written."""
        return dry_run_block(self.provider, type(self.provider()), self, script_dir, self.dry_run_job_output)

    def preflight(self) -> None:
        """The workers' address can be found on this host (`address_interface`)."""
        worker_address(self)

    def queue_warnings(self) -> list[str]:
        """What the site's queue limits cannot vouch for (PBS sites check their queue table)."""
        return []

    def job_environment(self) -> list[str]:
        """Shell lines run in the job after your `worker_init` (so they see what its modules
        set): environment the facility documents that needs the shell (`$VAR`, `unset`);
        every rank inherits it (`mpiexec --envall`, `srun --export=ALL`). None by default."""
        return []

    def renewed(self, excluded: list[str]) -> Site | None:
        """A block with as many more spares as nodes were excluded (the scheduler may hand
        back an excluded node; the supervisor skips it). Slurm does better: `--exclude`."""
        return self.model_copy(update={"spares": self.spares + len(excluded)})


def full_worker_init(site: BatchSite) -> str:
    """Parsl's scripts' folder on PATH (so `process_worker_pool.py` is found in a job that
    does not inherit the environment; `parsl_scripts_dir`), the site's TMPDIR, the user's
    `worker_init`, which wins over those, then the site's `job_environment()`, which needs
    what the user's modules set."""
    lines = [f"export PATH={parsl_scripts_dir()}:$PATH",
             f"export TMPDIR={shlex.quote(site.tmpdir)}" if site.tmpdir else "", site.worker_init.strip(),
             *site.job_environment()]
    return "\n".join(x for x in lines if x)


def worker_address(site: BatchSite, *, resolve: bool = True) -> str | None:
    """The address workers connect to: `site.address`, else the address of
    `site.address_interface` on this host (`<address of IF>` when not `resolve`, for the
    dry run), else that of the site's `PREFERRED_INTERFACE` where this host has one, else
    None (Parsl offers every address it finds)."""
    if site.address:
        return site.address
    if not site.address_interface:
        return preferred_address(site, resolve=resolve)
    if not resolve:
        return f"<address of {site.address_interface}>"
    from parsl.addresses import address_by_interface

    try:
        return str(address_by_interface(site.address_interface))
    except OSError as e:
        raise SiteError(f"site.address_interface: no address for interface {site.address_interface!r} on this "
                        f"host ({e.strerror or e}); set site.address, or address_interface to one of this "
                        f"host's interfaces (`ip -brief addr`)") from e


def preferred_address(site: BatchSite, *, resolve: bool = True) -> str | None:
    """The address of the site's preferred interface when this host has it; None otherwise."""
    name = site.PREFERRED_INTERFACE
    if name is None:
        return None
    if not resolve:
        return f"<address of {name} if this host has it>"
    from parsl.addresses import address_by_interface

    try:
        return str(address_by_interface(name))
    except OSError:  # not on this host (e.g. a login node without it): every address, as before
        return None


def executor(site: BatchSite, provider: ExecutionProvider, *, resolve: bool = True) -> HighThroughputExecutor:
    """The one-worker HighThroughputExecutor every batch site uses."""
    from parsl.executors import HighThroughputExecutor

    bindir = parsl_scripts_dir()
    address = worker_address(site, resolve=resolve)
    kwargs: dict[str, Any] = {"address": address} if address else {}
    return HighThroughputExecutor(
        label=LABEL,
        # the interchange runs here (login node), with this interpreter
        interchange_launch_cmd=interchange_command(bindir),
        max_workers_per_node=1,
        cores_per_worker=1,
        heartbeat_period=10,
        heartbeat_threshold=120,
        provider=provider,
        **kwargs,
    )


def parsl_config(site: BatchSite, provider: ExecutionProvider, run_dir: Path) -> Config:
    """A fresh Config around `provider` (Parsl configs must not be reused across loads)."""
    from parsl.config import Config

    return Config(
        executors=[executor(site, provider)],
        run_dir=str(run_dir),
        strategy="simple",  # a new block when the old one ended (walltime) and work is waiting
        strategy_period=2,
        max_idletime=IDLE_BLOCK_S,
        usage_tracking=0,
        initialize_logging=True,
    )


def provider_kwargs(site: BatchSite) -> dict[str, Any]:
    """What every provider gets: one block of nodes + spares, one worker, the user's init."""
    from parsl.launchers import SimpleLauncher

    return {
        "nodes_per_block": site.block_nodes,
        "init_blocks": 1,
        "min_blocks": 0,
        "max_blocks": 1,
        "launcher": SimpleLauncher(),  # exactly one worker, on the head node
        "walltime": site.walltime,
        "worker_init": full_worker_init(site),
        "cmd_timeout": 60,
    }


def cancel_jobs(provider: ExecutionProvider, job_ids: list[str]) -> list[bool]:
    """Cancel scheduler jobs through the provider; Parsl's `cancel` indexes
    `provider.resources[job_id]`, so ids it did not submit are registered first."""
    from parsl.jobs.states import JobState, JobStatus

    for jid in job_ids:
        provider.resources.setdefault(jid, {"job_id": jid, "status": JobStatus(JobState.UNKNOWN),
                                            "job_stdout_path": None, "job_stderr_path": None})
    return list(provider.cancel(list(job_ids)))


# --- dry run ------------------------------------------------------------------------------

SUBMIT_TIME = "<submit-time>"


def dry_run_block(make_provider: Callable[[type], ExecutionProvider], provider_cls: type,
                  site: BatchSite, script_dir: Path, fake_job_output: str) -> tuple[str, list[str]]:
    """(batch script, scheduler commands) the provider would use for the first block.

    Runs the provider's own `submit()` (its launcher, its template, its job config) on a
    subclass whose scheduler commands and script writes are captured instead of run or
    written: nothing is submitted and no file is created. `make_provider(cls)` builds the
    provider exactly as the site's `parsl_config` does, with `cls` as its class.
    """
    captured: dict[str, Any] = {"commands": []}

    def execute_wait(self: Any, cmd: str, timeout: float | None = None) -> tuple[int, str, str]:
        if cmd.startswith(("qsub", "sbatch")):  # as the provider would run it (e.g. in its submit_dir)
            captured["commands"].append(getattr(self, "submit_command", str)(cmd))
            return 0, fake_job_output, ""
        return 1, "", "dry run: not run"

    def write_script(self: Any, template: str, script_filename: str, job_name: str, configs: dict[str, Any]) -> None:
        captured["script"] = string.Template(template).substitute(jobname=job_name, **configs)
        captured["job_name"] = job_name

    dry_cls = type(f"DryRun{provider_cls.__name__}", (provider_cls,),
                   {"execute_wait": execute_wait, "_write_submit_script": write_script})
    provider = make_provider(dry_cls)
    provider.script_dir = str(script_dir)
    exe = executor(site, provider, resolve=False)
    provider.submit(worker_command(exe), 1, f"parsl.{LABEL}.block-0")
    stamped = captured["job_name"]  # the provider appends time.time(): show a placeholder
    base = stamped.rsplit(".", 2)[0]
    script = captured["script"].replace(stamped, f"{base}.{SUBMIT_TIME}")
    commands = [c.replace(stamped, f"{base}.{SUBMIT_TIME}") for c in captured["commands"]]
    return script, commands


class _Placeholders(dict):  # type: ignore[type-arg]
    def __missing__(self, key: str) -> str:
        return f"<{key}>"


def worker_command(exe: HighThroughputExecutor) -> str:
    """The executor's worker launch command as Parsl fills it at start; values known only
    once the interchange runs (addresses, port, log dirs) are shown as `<name>`."""
    known = _Placeholders(
        debug="", prefetch_capacity=exe.prefetch_capacity, address_probe_timeout_string="",
        cores_per_worker=exe.cores_per_worker, mem_per_worker=exe.mem_per_worker,
        max_workers_per_node=f"--max_workers_per_node={exe.max_workers_per_node}",
        nodes_per_block=exe.provider.nodes_per_block if exe.provider else 1,
        heartbeat_period=exe.heartbeat_period, heartbeat_threshold=exe.heartbeat_threshold,
        drain_period=exe.drain_period, poll_period=exe.poll_period, cpu_affinity=exe.cpu_affinity,
        enable_mpi_mode="", mpi_launcher=exe.mpi_launcher, accelerators="",
    )
    return string.Formatter().vformat(exe.launch_cmd, (), known).format(block_id=0)
