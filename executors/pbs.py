"""What the PBS Pro sites (`aurora`, `polaris`) share: the job's directives, the Parsl
`PBSProProvider`, and the module functions each site exposes. A PBS site module defines its
options model (a `PBSSite` with `kind`, defaults and `launch_options()`), `CPUS_PER_NODE`,
`SELECT_OPTIONS` and `DRY_RUN_JOB_ID`, then binds these functions with `functions(...)`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from campaign.executors import batch, queues

if TYPE_CHECKING:
    from parsl.config import Config
    from parsl.providers import PBSProProvider


class PBSSite(batch.BatchSite):
    """Fields every PBS Pro site has."""

    account: str = Field(min_length=1)
    """ALCF project charged for the blocks (qsub -A)."""
    queue: str = "debug"
    """PBS queue: debug, debug-scaling, prod (a routing queue), ...; the block (nodes + spares,
    walltime) must fit its limits (executors/queues.py). `debug` takes the default block
    (2 nodes, 1 h) on Aurora and Polaris; a larger block names the queues that take it."""
    filesystems: str = "home:flare"
    """Filesystems the job needs (-l filesystems=)."""
    place: str = "scatter"
    """Chunk placement (-l place=)."""
    launcher: Literal["pals", "mpich"] = "pals"
    """`pals` on the machine; `mpich` (mpiexec -launcher fork) is the single-machine test stand-in."""

    @model_validator(mode="after")
    def _queue_takes_the_block(self) -> PBSSite:
        table = queues.TABLES.get(getattr(self, "kind", ""))
        if table is not None:
            problems, _ = queues.check(table, self.queue, self.block_nodes, self.walltime_s)
            if problems:
                raise ValueError("site.queue: " + "; ".join(problems))
        return self

    def queue_warnings(self) -> list[str]:
        """What the queue table cannot vouch for: by-request or preemptable queues, ALCF's
        approximate largest sizes, queues not in the table."""
        table = queues.TABLES.get(getattr(self, "kind", ""))
        return queues.check(table, self.queue, self.block_nodes, self.walltime_s)[1] if table else []


def directives(site: PBSSite) -> str:
    """The `#PBS` lines of a block: filesystems, placement, keep output, the user's extras."""
    lines = [f"#PBS -l filesystems={site.filesystems}", f"#PBS -l place={site.place}", "#PBS -k doe"]
    return "\n".join(lines + ([site.scheduler_options.strip()] if site.scheduler_options.strip() else []))


def provider(site: PBSSite, *, cpus_per_node: int, select_options: str = "", cls: type | None = None
             ) -> PBSProProvider:
    """The site's PBSProProvider (`cls`: a subclass, for the dry run)."""
    from parsl.providers import PBSProProvider

    return (cls or PBSProProvider)(account=site.account, queue=site.queue, cpus_per_node=cpus_per_node,
                                   select_options=select_options, scheduler_options=directives(site),
                                   **batch.provider_kwargs(site))


def functions(cpus_per_node: int, select_options: str, dry_run_job_id: str) -> dict[str, Callable[..., Any]]:
    """`provider`, `parsl_config`, `cancel_jobs` and `dry_run` for one PBS site module."""

    def site_provider(site: PBSSite, cls: type | None = None) -> PBSProProvider:
        return provider(site, cpus_per_node=cpus_per_node, select_options=select_options, cls=cls)

    def parsl_config(site: PBSSite, run_dir: Path) -> Config:
        """A fresh Parsl Config: one PBS Pro block of nodes + spares, one worker on its head node."""
        return batch.parsl_config(site, site_provider(site), run_dir)

    def cancel_jobs(site: PBSSite, job_ids: list[str]) -> list[bool]:
        """qdel the jobs through the provider."""
        return batch.cancel_jobs(site_provider(site), job_ids)

    def dry_run(site: PBSSite, script_dir: Path) -> tuple[str, list[str]]:
        """(PBS script, qsub command) of the first block; nothing is submitted or written."""
        from parsl.providers import PBSProProvider

        return batch.dry_run_block(lambda cls: site_provider(site, cls), PBSProProvider, site, script_dir,
                                   dry_run_job_id)

    return {"provider": site_provider, "parsl_config": parsl_config, "cancel_jobs": cancel_jobs, "dry_run": dry_run}
