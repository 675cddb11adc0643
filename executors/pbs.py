"""What the PBS Pro sites (`aurora`, `polaris`) share: the job's directives and the Parsl
`PBSProProvider`. A PBS site module subclasses `PBSSite` with its `kind`, defaults,
`launch_options()` and three class constants: `CPUS_PER_NODE` (PBS `ncpus`),
`SELECT_OPTIONS` (extra `select` resources such as `ngpus=4`) and `DRY_RUN_JOB_ID`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from campaign.executors import batch

if TYPE_CHECKING:
    from parsl.providers import PBSProProvider


class PBSSite(batch.BatchSite):
    """Fields every PBS Pro site has."""

    CPUS_PER_NODE: ClassVar[int]
    SELECT_OPTIONS: ClassVar[str] = ""
    DRY_RUN_JOB_ID: ClassVar[str]

    account: str = Field(min_length=1)
    """ALCF project charged for the blocks (qsub -A)."""
    queue: str = "prod"
    """PBS queue: debug, debug-scaling, prod (a routing queue)."""
    filesystems: str = "home:flare"
    """Filesystems the job needs (-l filesystems=)."""
    place: str = "scatter"
    """Chunk placement (-l place=)."""
    launcher: Literal["pals", "mpich"] = "pals"
    """`pals` on the machine; `mpich` (mpiexec -launcher fork) is the single-machine test stand-in."""

    def provider(self, cls: type | None = None) -> PBSProProvider:
        """The site's PBSProProvider (`cls`: a subclass, for the dry run)."""
        from parsl.providers import PBSProProvider

        return (cls or PBSProProvider)(account=self.account, queue=self.queue, cpus_per_node=self.CPUS_PER_NODE,
                                       select_options=self.SELECT_OPTIONS, scheduler_options=directives(self),
                                       **batch.provider_kwargs(self))

    @property
    def dry_run_job_output(self) -> str:
        return self.DRY_RUN_JOB_ID


def directives(site: PBSSite) -> str:
    """The `#PBS` lines of a block: filesystems, placement, keep output, the user's extras."""
    lines = [f"#PBS -l filesystems={site.filesystems}", f"#PBS -l place={site.place}", "#PBS -k doe"]
    return "\n".join(lines + ([site.scheduler_options.strip()] if site.scheduler_options.strip() else []))
