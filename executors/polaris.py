"""The `polaris` site: ALCF Polaris, PBS Pro blocks, PALS `mpiexec`, 4 A100s per node.

Fields a user changes (in the campaign file, under `site:`):
    account        your ALCF project (qsub -A)
    queue          `debug` (default: 1-2 nodes, 1 h), `debug-scaling` (1-10, 1 h), `prod` (10-496
                   nodes, routes by size: <= 24 / 3 h, <= 99 / 6 h, <= 496 / 24 h), `preemptable`,
                   ...; the block (nodes + spares, walltime) is checked against executors/queues.py
    walltime       of one block, HH:MM:SS
    nodes, spares  active nodes a stage may use, and extra nodes that replace excluded ones
    worker_init    activates your environment, e.g. `module use /soft/modulefiles; module load conda; conda activate base`
    collective_env ALCF's NCCL/aws-ofi-nccl variables on every rank and the plugin on LD_LIBRARY_PATH
                   (default true; `env` overrides one variable)
    tmpdir         TMPDIR of the job's Parsl worker (default /tmp: AF_UNIX paths stay short)
    address_interface  interface workers connect to (default: every address Parsl finds, as ALCF's
                   current Parsl page does; `bond0` if your login node needs it)

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
# ALCF's NCCL page (https://docs.alcf.anl.gov/polaris/applications-and-libraries/libraries/nccl/,
# argonne-lcf/user-guides docs/polaris/applications-and-libraries/libraries/nccl.md @ ed3908de,
# 2025-01-21): "We have done extensive performance tests and identified the following
# best environment setup" (2-3x faster collectives through the aws-ofi-nccl plugin). The
# page warns that some applications (Megatron-DeepSpeed) hang with the plugin:
# `collective_env: false`.
COLLECTIVE_ENV: tuple[tuple[str, str], ...] = (
    ("NCCL_NET_GDR_LEVEL", "PHB"),
    ("NCCL_CROSS_NIC", "1"),
    ("NCCL_COLLNET_ENABLE", "1"),
    ("NCCL_NET", "AWS Libfabric"),
    ("FI_CXI_DISABLE_HOST_REGISTER", "1"),
    ("FI_MR_CACHE_MONITOR", "userfaultfd"),
    ("FI_CXI_DEFAULT_CQ_SIZE", "131072"),
)
# The same setup's library paths, as the page lists them: NCCL_NET="AWS Libfabric" makes NCCL
# load that plugin or fail, so the plugin must be on LD_LIBRARY_PATH whenever NCCL_NET is
# forced (they prepend to what worker_init's modules set, so they run after it).
PLUGIN_PATHS: tuple[str, ...] = ("/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib", "/soft/libraries/hwloc/lib/")
COLLECTIVE_JOB_LINES: tuple[str, ...] = tuple(f"export LD_LIBRARY_PATH={path}:$LD_LIBRARY_PATH"
                                              for path in PLUGIN_PATHS)
# ALCF's Parsl page (https://docs.alcf.anl.gov/polaris/workflows/parsl/) sets no `address`
# in its current version (docs/polaris/workflows/parsl.md @ fb0b8c2d, 2026-08-04); the `bond0`
# advice of its older "Updates" section ("needs to be set to address_by_interface("bond0")",
# removed in 1b11df2d, 2025-02-28) is gone.
# So no default: Parsl offers every address it finds; `address_interface: bond0` still works.
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
    COLLECTIVE_ENV: ClassVar[tuple[tuple[str, str], ...]] = COLLECTIVE_ENV
    COLLECTIVE_JOB_LINES: ClassVar[tuple[str, ...]] = COLLECTIVE_JOB_LINES
    COMPUTE_NODES_ONLINE: ClassVar[bool] = False
    """Polaris' compute nodes reach the internet only through ALCF's proxy: W&B logs offline by default."""

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
        if self.launcher == "mpich":  # the single-machine stand-in: no fabric
            return LaunchOptions(env={"MASTER_ADDR": "127.0.0.1", **dict(NVIDIA_NO_MULTICAST_ENV), **self.env})
        env = self.rank_env(dict(NVIDIA_NO_MULTICAST_ENV))
        wrapper = GPU_WRAPPER if self.gpu_affinity else ()
        return LaunchOptions(env=env, cpu_bind=CPU_BIND, depth=self.depth, wrapper=wrapper)
