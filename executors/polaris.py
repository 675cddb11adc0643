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

from typing import ClassVar, Literal

from pydantic import Field

from campaign.executors import pbs
from campaign.executors.base import LaunchOptions
from campaign.executors.launchers import NVIDIA_NO_MULTICAST_ENV

# https://docs.alcf.anl.gov/polaris/running-jobs/using-gpus/ : 4 A100s per node, ranks
# spread with --depth=8 --cpu-bind depth; GPUs assigned in reverse order (topology) by
# set_affinity_gpu_polaris.sh. Inlined here so no script file has to exist on the nodes.
RANKS_PER_NODE = 4
DEPTH = 8
CPU_BIND = "depth"
GPU_WRAPPER: tuple[str, ...] = (
    "bash",
    "-c",
    'export CUDA_VISIBLE_DEVICES=$((3 - PMI_LOCAL_RANK % 4)); exec "$@"',
    "set_affinity_gpu_polaris",
)


class PolarisSite(pbs.PBSSite):
    """ALCF Polaris: PBS Pro blocks, PALS mpiexec, one rank per A100."""

    CPUS_PER_NODE: ClassVar[int] = 64
    """Logical CPUs of a Polaris node (32 cores x 2 hyperthreads): PBS `ncpus`."""
    SELECT_OPTIONS: ClassVar[str] = "ngpus=4"
    DRY_RUN_JOB_ID: ClassVar[str] = "DRYRUN.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov"

    kind: Literal["polaris"] = "polaris"
    """Site kind."""
    filesystems: str = "home:eagle"
    """Filesystems the job needs (-l filesystems=)."""
    ranks_per_node: int = Field(default=RANKS_PER_NODE, ge=1, le=64)
    """Ranks per node (4: one per GPU)."""
    depth: int = Field(default=DEPTH, ge=1, le=64)
    """Logical CPUs per rank (PALS --depth), with --cpu-bind=depth."""
    gpu_affinity: bool = True
    """Give rank i of a node GPU 3 - i % 4 (the inlined set_affinity_gpu_polaris.sh)."""

    def devices(self) -> tuple[str, int | None]:
        return "cuda", 4

    def launch_options(self) -> LaunchOptions:
        """CPU binding, the GPU affinity wrapper, and the NVIDIA environment."""
        env = {**dict(NVIDIA_NO_MULTICAST_ENV), **self.env}
        if self.launcher == "mpich":
            return LaunchOptions(env={"MASTER_ADDR": "127.0.0.1", **env})
        wrapper = GPU_WRAPPER if self.gpu_affinity else ()
        return LaunchOptions(env=env, cpu_bind=CPU_BIND, depth=self.depth, wrapper=wrapper)
