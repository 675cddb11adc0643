"""The `polaris` site: ALCF Polaris, PBS Pro blocks, PALS `mpiexec`, 4 A100s per node.

Fields a user changes (in the campaign file, under `site:`):
    account        your ALCF project (qsub -A)
    queue          `debug` (default: 1-2 nodes, 1 h), `debug-scaling` (1-10, 1 h), `prod` (10-496
                   nodes, routes by size: <= 24 / 3 h, <= 99 / 6 h, <= 496 / 24 h), `preemptable`,
                   ...; the block (nodes + spares, walltime) is checked against executors/queues.py
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

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from campaign.executors import pbs
from campaign.executors.launchers import (
    NVIDIA_NO_MULTICAST_ENV,
    POLARIS_CPU_BIND,
    POLARIS_DEPTH,
    POLARIS_GPU_WRAPPER,
    POLARIS_RANKS_PER_NODE,
)

if TYPE_CHECKING:
    pass

CPUS_PER_NODE = 64
"""Logical CPUs of a Polaris node (32 cores x 2 hyperthreads): PBS `ncpus`."""


class PolarisSite(pbs.PBSSite):
    """ALCF Polaris: PBS Pro blocks, PALS mpiexec, one rank per A100."""

    kind: Literal["polaris"] = "polaris"
    """Site kind."""
    filesystems: str = "home:eagle"
    """Filesystems the job needs (-l filesystems=)."""
    ranks_per_node: int = Field(default=POLARIS_RANKS_PER_NODE, ge=1, le=64)
    """Ranks per node (4: one per GPU)."""
    depth: int = Field(default=POLARIS_DEPTH, ge=1, le=64)
    """Logical CPUs per rank (PALS --depth), with --cpu-bind=depth."""
    gpu_affinity: bool = True
    """Give rank i of a node GPU 3 - i % 4 (the inlined set_affinity_gpu_polaris.sh)."""

    def launch_options(self) -> dict[str, Any]:
        """The supervisor's `request["launch"]`: binding, GPU wrapper, NVIDIA environment."""
        env = {**dict(NVIDIA_NO_MULTICAST_ENV), **self.env}
        if self.launcher == "mpich":
            return {"env": {"MASTER_ADDR": "127.0.0.1", **env}}
        wrapper = list(POLARIS_GPU_WRAPPER) if self.gpu_affinity else []
        return {"cpu_bind": POLARIS_CPU_BIND, "depth": self.depth, "wrapper": wrapper, "env": env}


_pbs = pbs.functions(CPUS_PER_NODE, "ngpus=4", "DRYRUN.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov")
provider = _pbs["provider"]
parsl_config = _pbs["parsl_config"]
cancel_jobs = _pbs["cancel_jobs"]
dry_run = _pbs["dry_run"]
