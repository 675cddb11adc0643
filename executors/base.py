"""The site contract: what the engine, the supervisor's request and the dry run may ask of a
site, in one place. Every site (`local`, `aurora`, `polaris`, `slurm`) is a pydantic options
model that subclasses `Site` and answers these questions; nothing else reaches into a site.

    site.parsl_config(run_dir)     a fresh Parsl Config whose executor is labelled LABEL
    site.launcher                  the launcher of the trainer: local, pals, mpich, srun
    site.launch_options()          binding, wrapper and environment for that launcher
    site.block_nodes               nodes of one block (active + spares)
    site.node_names()              the allocation's names when the site knows them (local), else None
    site.example_nodes(n)          placeholder names for a dry run
    site.devices()                 (device type, devices per node) for the dry run's placement
    site.block_walltime_s()        the block's walltime (None: no deadline)
    site.deadline_from             whether that walltime counts from the block's or the attempt's start
    site.cancel_jobs(ids)          stop scheduler jobs through the provider
    site.preflight_warnings()      lines to print before submitting (what only the machine can tell)
    site.dry_run(script_dir)       (batch script, submit commands) of the first block, or None
    site.renewed(excluded)         the site of a new block that avoids `excluded`, or None

Words (Parsl's): a *block* is one scheduler job; its nodes are the *allocation*; the
*launcher* starts the trainer's ranks on the *active* nodes of the allocation.
"""

from __future__ import annotations

import shutil
import sys
from abc import abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from campaign.stagebase import StrictModel

if TYPE_CHECKING:
    from parsl.config import Config

LABEL = "campaign"
"""The label of every site's Parsl executor: the engine runs its supervisor app there."""


def parsl_scripts_dir() -> Path:
    """Where Parsl's `interchange.py` and `process_worker_pool.py` live: next to this
    interpreter (a venv, even one not activated), else wherever PATH finds them (e.g. an
    install with `pip --target DIR`, whose scripts land in DIR/bin)."""
    bindir = Path(sys.executable).parent
    if (bindir / "interchange.py").exists():
        return bindir
    found = shutil.which("interchange.py")
    return Path(found).parent if found else bindir


def interchange_command(bindir: Path) -> list[str]:
    """How the driver starts Parsl's interchange: with this interpreter, through
    `campaign.executors.parsl_interchange` (its own process group; it exits with the driver)."""
    return [sys.executable, "-m", "campaign.executors.parsl_interchange", str(bindir / "interchange.py")]


@dataclass(frozen=True)
class LaunchOptions:
    """How a site's launcher places ranks: binding in the launcher's own syntax, an argv
    prefix run on every rank (e.g. Polaris' GPU affinity), and environment for every rank."""

    env: dict[str, str] = field(default_factory=dict)
    cpu_bind: str | None = None
    gpu_bind: str | None = None
    depth: int | None = None
    wrapper: tuple[str, ...] = ()


class Site(StrictModel):
    """Base of every site's options model (pydantic's model metaclass is an ABCMeta, so a
    site that misses an abstract method cannot be instantiated)."""

    COMPUTE_NODES_ONLINE: ClassVar[bool] = True
    """Whether the site's compute nodes reach the internet; where they do not (ALCF's), W&B
    logs offline by default (`observe.wandb.mode`), for `wandb sync` from a login node."""

    if TYPE_CHECKING:  # a field on PBS sites (pals | mpich), a property elsewhere
        launcher: str
        """The launcher the supervisor starts the trainer with (`executors.launchers`)."""
        nodes: int
        """Active nodes a stage may use (its default node count)."""
        ranks_per_node: int

    @abstractmethod
    def parsl_config(self, run_dir: Path) -> Config:
        """A fresh Parsl Config (Parsl configs must not be reused across loads), executor LABEL."""

    @abstractmethod
    def launch_options(self) -> LaunchOptions:
        """Binding, wrapper and extra environment for every launch on this site."""

    @property
    def block_nodes(self) -> int:
        """Nodes of one block (batch sites add their spares)."""
        return self.nodes

    def node_names(self) -> list[str] | None:
        """The allocation's node names when the site knows them; None: the supervisor reads
        them from the scheduler inside the block (`PBS_NODEFILE`, `SLURM_JOB_NODELIST`)."""
        return None

    def example_nodes(self, n: int) -> list[str]:
        """Placeholder node names for a dry run (the real ones are known only in the job)."""
        return self.node_names() or [f"node{i:03d}" for i in range(1, n + 1)]

    def devices(self) -> tuple[str, int | None]:
        """(device type, devices a node shows when nothing narrows them) of this site's nodes,
        for the dry run's placement table; ("cpu", None) unless the site has accelerators."""
        return "cpu", None

    @property
    def rank_variables(self) -> str:
        """Whose rank variables the trainer's ranks get on this site (`placement.rank_environment`):
        what the dry run computes each rank's numbers from."""
        return {"local": "torchrun", "srun": "srun", "mpich": "mpich"}.get(self.launcher, self.launcher)

    def preflight(self) -> None:
        """Check, on the driver's host and before the ledger is touched, what only this host
        can tell (e.g. that a named network interface exists); SiteError when it cannot work."""

    def scheduler_commands(self) -> tuple[str, ...]:
        """The scheduler's commands this site's Parsl provider runs on the driver's host
        (`campaign.preflight` refuses a submission where one is not on PATH); none by default."""
        return ()

    def preflight_warnings(self) -> list[str]:
        """What the site's options suggest will go badly where only the machine can tell (one
        line each, "field: problem; fix"); `campaign.preflight` prints them, never refuses.
        Includes `settings_warnings()`."""
        return self.settings_warnings()

    def settings_warnings(self) -> list[str]:
        """The part of `preflight_warnings` that the campaign file alone tells (no host looked
        at): `campaign validate` prints these too. None by default."""
        return []

    def workdir_warnings(self, workdir: Path, *, remote: bool) -> list[str]:
        """What the facility says against running from `workdir` (`remote`: the path is
        resolved on an endpoint's host, a relative one under its $HOME); none by default."""
        return []

    def remote_workdir(self) -> Path | None:
        """The work directory `submit --endpoint` uses on the endpoint's host when no
        --workdir is given (None: the CLI's default, `campaigns` under the endpoint's $HOME)."""
        return None

    def block_walltime_s(self) -> float | None:
        """How long a block (or, see `deadline_from`, an attempt) may run; None: no limit."""
        return None

    @property
    def deadline_from(self) -> Literal["block", "attempt"]:
        """Whether `block_walltime_s` counts from the block's start or each attempt's."""
        return "block"

    def cancel_jobs(self, job_ids: list[str]) -> list[bool]:
        """Cancel scheduler jobs through the provider; a site without a scheduler has none."""
        return [False for _ in job_ids]

    def dry_run(self, script_dir: Path) -> tuple[str, list[str]] | None:
        """(batch script, submit commands) of the first block, nothing submitted; None: no batch script."""
        return None

    def renewed(self, excluded: list[str]) -> Site | None:
        """The site of a new block that can still provide the stage's nodes when `excluded`
        spent the spares; None where a new block cannot help (the local site)."""
        return None
