"""The `slurm` site: any Slurm cluster, `sbatch` blocks, `srun` for the trainer.

Fields a user changes (in the campaign file, under `site:`):
    partition      the partition (sbatch --partition); account if the cluster wants one
    walltime       of one block, HH:MM:SS
    nodes, spares  active nodes a stage may use, and extra nodes that replace excluded ones
    ranks_per_node one per GPU on a GPU cluster
    worker_init    activates your environment, e.g. `module load python; source ~/venv/bin/activate`

A block is one `sbatch` job of nodes + spares nodes (Parsl's SlurmProvider). One Parsl
worker runs in the batch step on the first node; the trainer is started with
`srun --nodes=N --ntasks=W --nodelist=<active nodes> --exclude=<excluded nodes>`, so no
rank can land on a node the ledger excludes, and each rank knows its node from
`SLURMD_NODENAME`. On NVIDIA machines without NVLink multicast add
`NCCL_NVLS_ENABLE: "0"` (and friends, see docs/launchers.md) to `env`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from campaign.executors import batch
from campaign.executors.base import LaunchOptions

if TYPE_CHECKING:
    from parsl.providers import SlurmProvider


class SlurmSite(batch.BatchSite):
    """A Slurm cluster: sbatch blocks, srun with --nodelist/--exclude."""

    kind: Literal["slurm"] = "slurm"
    """Site kind."""
    partition: str | None = None
    """Partition of the blocks (sbatch --partition); null: the cluster's default."""
    account: str | None = None
    """Account charged (sbatch --account); null: your default."""
    qos: str | None = None
    """Quality of service (sbatch --qos)."""
    ranks_per_node: int = Field(default=1, ge=1, le=256)
    """Ranks per node (srun --ntasks-per-node)."""
    gpus_per_node: int | None = Field(default=None, ge=1)
    """GPUs to request per node (sbatch --gpus-per-node)."""
    cpus_per_task: int | None = Field(default=None, ge=1)
    """CPUs per rank (srun --cpus-per-task)."""
    cpu_bind: str | None = None
    """srun --cpu-bind value (e.g. `cores`)."""
    gpu_bind: str | None = None
    """srun --gpu-bind value: `single:1` (one GPU per rank, the closest free one), `map_gpu:...`,
    ... `closest` is refused with more than one rank per node: it may give a rank every GPU of
    its NUMA domain, and two ranks would then share a GPU (docs/sites.md)."""
    exclusive: bool = True
    """Ask for whole nodes (sbatch --exclusive)."""

    @model_validator(mode="after")
    def _one_gpu_per_rank(self) -> SlurmSite:
        # srun(1), --gpu-bind: "closest: Bind each task to the GPU(s) which are closest. In a NUMA
        # environment, each task may be bound to more than one GPU (i.e. all GPUs in that NUMA
        # environment)"; "single:<tasks_per_gpu>: Like --gpu-bind=closest, except that each task
        # can only be bound to a single GPU, even when it can be bound to multiple GPUs that are
        # equally close" (Slurm 22.05.8's man page).
        if (self.gpu_bind or "").split(",")[-1] == "closest" and self.ranks_per_node > 1:
            raise ValueError(f"site.gpu_bind: closest may bind each of the {self.ranks_per_node} ranks of a node to "
                             "every GPU of its NUMA domain (srun(1)), e.g. 2 of a 2-socket node's 4 GPUs, and two ranks "
                             "would then drive one GPU (NCCL refuses that); use gpu_bind: single:1 (the closest GPU, "
                             "one per rank)")
        return self

    @property
    def launcher(self) -> str:
        return "srun"

    def scheduler_commands(self) -> tuple[str, ...]:
        """What Parsl's SlurmProvider runs: sbatch (submit), squeue (status), scancel (cancel)."""
        return ("sbatch", "squeue", "scancel")

    def devices(self) -> tuple[str, int | None]:
        return ("cuda", self.gpus_per_node) if self.gpus_per_node else ("cpu", None)

    def launch_options(self) -> LaunchOptions:
        """srun binding and extra environment."""
        return LaunchOptions(env=dict(self.env), cpu_bind=self.cpu_bind, gpu_bind=self.gpu_bind,
                             depth=self.cpus_per_task)

    def provider(self, cls: type | None = None) -> SlurmProvider:
        """The site's SlurmProvider (`cls`: a subclass, for the dry run)."""
        from parsl.providers import SlurmProvider

        return (cls or SlurmProvider)(partition=self.partition, account=self.account, qos=self.qos,
                                      gpus_per_node=self.gpus_per_node, exclusive=self.exclusive,
                                      scheduler_options=self.scheduler_options.strip(), **batch.provider_kwargs(self))

    @property
    def dry_run_job_output(self) -> str:
        return "Submitted batch job 0"

    def renewed(self, excluded: list[str]) -> SlurmSite:
        """The site for a new block that Slurm builds without the excluded nodes."""
        line = f"#SBATCH --exclude={','.join(sorted(excluded))}"
        options = "\n".join(x for x in (self.scheduler_options.strip(), line) if x)
        return self.model_copy(update={"scheduler_options": options})
