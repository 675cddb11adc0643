"""The `aurora` site: ALCF Aurora, PBS Pro blocks, PALS `mpiexec`, 12 ranks per node.

Fields a user changes (in the campaign file, under `site:`):
    account        your ALCF project (qsub -A)
    queue          `debug` (1-2 nodes), `debug-scaling` (2-31), `prod` (routes by size)
    walltime       of one block, HH:MM:SS (prod: up to 6 h for <= 512 nodes, 12 h for 513-1024)
    nodes, spares  active nodes a stage may use, and extra nodes that replace excluded ones
    worker_init    activates your environment, e.g. `module load frameworks; source ~/venv/bin/activate`

A block is `qsub -l select=N:ncpus=208 -l filesystems=home:flare -l place=scatter`, as
ALCF recommends (https://docs.alcf.anl.gov/aurora/running-jobs-aurora/, and Parsl on
Aurora: https://docs.alcf.anl.gov/aurora/workflows/parsl/). One Parsl worker runs on the
head node; the trainer is started with PALS `mpiexec --hostfile` over the active nodes,
12 ranks per node, `--cpu-bind=list:...` leaving cores 0 and 52 to the OS and one GPU tile
per rank (`--gpu-bind=list:0.0:0.1:...`; set `gpu_bind: null` with
`ZE_FLAT_DEVICE_HIERARCHY=FLAT`, see docs/launchers.md).

`launcher: mpich` is a STAND-IN for tests on one machine (the PBS emulator in tests/infra):
MPICH `mpiexec -launcher fork` starts every rank locally under the node names of
`PBS_NODEFILE`; the CPU/GPU binding is dropped and `MASTER_ADDR` is 127.0.0.1.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from campaign.executors import pbs
from campaign.executors.base import LaunchOptions

# https://docs.alcf.anl.gov/aurora/running-jobs-aurora/ ("Binding MPI ranks and threads
# to cores", Example 4): 12 ranks x 8 cores, 6 per socket, cores 0 and 52 left free.
RANKS_PER_NODE = 12
CPU_BIND = "list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100"
# Same page, "Binding MPI ranks to GPUs using --gpu-bind": one rank per tile. The page
# warns it fails for implicit (whole-GPU) lists and with ZE_FLAT_DEVICE_HIERARCHY=FLAT
# (the frameworks module); there leave gpu_bind None and pick xpu:LOCAL_RANK in the trainer.
GPU_BIND = "list:0.0:0.1:1.0:1.1:2.0:2.1:3.0:3.1:4.0:4.1:5.0:5.1"


class AuroraSite(pbs.PBSSite):
    """ALCF Aurora: PBS Pro blocks, PALS mpiexec, one rank per GPU tile."""

    CPUS_PER_NODE: ClassVar[int] = 208
    """Logical CPUs of an Aurora node (2 x 52 cores x 2 hyperthreads): PBS `ncpus`."""
    DRY_RUN_JOB_ID: ClassVar[str] = "DRYRUN.aurora-pbs-0001.hostmgmt.cm.aurora.alcf.anl.gov"

    kind: Literal["aurora"] = "aurora"
    """Site kind."""
    filesystems: str = "home:flare"
    """Filesystems the job needs (-l filesystems=); add daos_user for DAOS."""
    ranks_per_node: int = Field(default=RANKS_PER_NODE, ge=1, le=208)
    """Ranks per node (12: one per GPU tile)."""
    cpu_bind: str | None = CPU_BIND
    """PALS --cpu-bind value (default: 8 cores per rank, cores 0 and 52 left to the OS)."""
    gpu_bind: str | None = GPU_BIND
    """PALS --gpu-bind value (default: rank i on tile i//2.i%2); null to leave binding to the trainer."""

    def launch_options(self) -> LaunchOptions:
        """CPU and GPU binding, and extra environment."""
        if self.launcher == "mpich":  # every rank runs here: no binding, loopback rendezvous
            return LaunchOptions(env={"MASTER_ADDR": "127.0.0.1", **self.env})
        return LaunchOptions(env=dict(self.env), cpu_bind=self.cpu_bind, gpu_bind=self.gpu_bind)
