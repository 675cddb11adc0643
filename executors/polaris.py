"""The `polaris` site: ALCF Polaris, PBS Pro blocks, PALS `mpiexec`, 4 A100s per node.

Fields a user changes (in the campaign file, under `site:`):
    account        your ALCF project (qsub -A)
    queue          `debug` (1-2 nodes), `debug-scaling` (1-10), `prod`
    walltime       of one block, HH:MM:SS
    nodes, spares  active nodes a stage may use, and extra nodes that replace excluded ones
    worker_init    activates your environment, e.g. `module use /soft/modulefiles; module load conda; conda activate base`

A block is `qsub -l select=N:ncpus=64:ngpus=4 -l filesystems=home:eagle -l place=scatter`
(https://docs.alcf.anl.gov/polaris/running-jobs/). The trainer starts with PALS
`mpiexec --hostfile ... --ppn 4 --depth=8 --cpu-bind=depth`; PALS cannot bind GPUs
there, so every rank goes through the inlined `set_affinity_gpu_polaris.sh`
(https://docs.alcf.anl.gov/polaris/running-jobs/using-gpus/). NVLink multicast is turned
off for NCCL/NVSHMEM/torch symmetric memory (`NCCL_NVLS_ENABLE=0`, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from campaign.executors import batch
from campaign.executors.launchers import (
    NVIDIA_NO_MULTICAST_ENV,
    POLARIS_CPU_BIND,
    POLARIS_DEPTH,
    POLARIS_GPU_WRAPPER,
    POLARIS_RANKS_PER_NODE,
)

if TYPE_CHECKING:
    from parsl.config import Config
    from parsl.providers import PBSProProvider

CPUS_PER_NODE = 64
"""Logical CPUs of a Polaris node (32 cores x 2 hyperthreads): PBS `ncpus`."""


class PolarisSite(batch.BatchSite):
    """ALCF Polaris: PBS Pro blocks, PALS mpiexec, one rank per A100."""

    kind: Literal["polaris"] = "polaris"
    """Site kind."""
    account: str = Field(min_length=1)
    """ALCF project charged for the blocks (qsub -A)."""
    queue: str = "prod"
    """PBS queue: debug, debug-scaling, prod."""
    filesystems: str = "home:eagle"
    """Filesystems the job needs (-l filesystems=)."""
    place: str = "scatter"
    """Chunk placement (-l place=)."""
    ranks_per_node: int = Field(default=POLARIS_RANKS_PER_NODE, ge=1, le=64)
    """Ranks per node (4: one per GPU)."""
    depth: int = Field(default=POLARIS_DEPTH, ge=1, le=64)
    """Logical CPUs per rank (PALS --depth), with --cpu-bind=depth."""
    gpu_affinity: bool = True
    """Give rank i of a node GPU 3 - i % 4 (the inlined set_affinity_gpu_polaris.sh)."""
    launcher: Literal["pals", "mpich"] = "pals"
    """`pals` on Polaris; `mpich` (mpiexec -launcher fork) is the single-machine test stand-in."""

    def launch_options(self) -> dict[str, Any]:
        """The supervisor's `request["launch"]`: binding, GPU wrapper, NVIDIA environment."""
        env = {**dict(NVIDIA_NO_MULTICAST_ENV), **self.env}
        if self.launcher == "mpich":
            return {"env": {"MASTER_ADDR": "127.0.0.1", **env}}
        wrapper = list(POLARIS_GPU_WRAPPER) if self.gpu_affinity else []
        return {"cpu_bind": POLARIS_CPU_BIND, "depth": self.depth, "wrapper": wrapper, "env": env}


def _directives(site: PolarisSite) -> str:
    lines = [f"#PBS -l filesystems={site.filesystems}", f"#PBS -l place={site.place}", "#PBS -k doe"]
    return "\n".join(lines + ([site.scheduler_options.strip()] if site.scheduler_options.strip() else []))


def provider(site: PolarisSite, cls: type | None = None) -> PBSProProvider:
    """The site's PBSProProvider (`cls`: a subclass, for the dry run)."""
    from parsl.providers import PBSProProvider

    kwargs = batch.provider_kwargs(site)
    return (cls or PBSProProvider)(account=site.account, queue=site.queue, cpus_per_node=CPUS_PER_NODE,
                                   select_options="ngpus=4", scheduler_options=_directives(site), **kwargs)


def parsl_config(site: PolarisSite, run_dir: Path) -> Config:
    """A fresh Parsl Config: one PBS Pro block of nodes + spares, one worker on its head node."""
    return batch.parsl_config(site, provider(site), run_dir)


def cancel_jobs(site: PolarisSite, job_ids: list[str]) -> list[bool]:
    """qdel the jobs through the provider."""
    return batch.cancel_jobs(provider(site), job_ids)


def dry_run(site: PolarisSite, script_dir: Path) -> tuple[str, list[str]]:
    """(PBS script, qsub command) of the first block; nothing is submitted or written."""
    from parsl.providers import PBSProProvider

    return batch.dry_run_block(lambda cls: provider(site, cls), PBSProProvider, site, script_dir,
                               "DRYRUN.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov")
