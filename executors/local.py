"""The `local` site: this machine, with N *virtual nodes* of R ranks each.

Fields a user changes (in the campaign file, under `site:`):
    nodes            how many virtual nodes to simulate (each a named group of ranks)
    ranks_per_node   ranks (processes) per virtual node
    bind_gpus        give each virtual node its own GPUs (a machine with several GPUs)

Every rank runs as a plain process here; `CAMPAIGN_NODE` tells it which virtual node it
belongs to, so heartbeats, suspects and exclusions work per node exactly as on a real
machine. Parsl runs the supervisor app through a HighThroughputExecutor on a
LocalProvider block of one worker, the same executor type the batch sites use.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from campaign.executors.base import LABEL, LaunchOptions, Site, interchange_command, parsl_scripts_dir

if TYPE_CHECKING:
    from parsl.config import Config


class LocalSite(Site):
    """Run on this machine; nodes are simulated as named groups of ranks."""

    kind: Literal["local"] = "local"
    """Site kind."""
    nodes: int = Field(default=2, ge=1, le=64)
    """Virtual nodes in the allocation."""
    ranks_per_node: int = Field(default=1, ge=1, le=64)
    """Ranks per virtual node."""
    node_prefix: str = Field(default="local-n", pattern=r"^[A-Za-z][A-Za-z0-9-]*$")
    """Virtual node names are this prefix plus 0, 1, ..."""

    walltime_s: float | None = Field(default=None, gt=0)
    """Simulated block walltime: each attempt must end within this many seconds of its
    start; the trainer checkpoints and exits 143 before that deadline (walltime chaining)."""
    bind_gpus: bool = False
    """Give virtual node i its own GPUs, as on a real node: its ranks see only GPUs
    i*R .. i*R+R-1 (R = ranks_per_node; CUDA_VISIBLE_DEVICES), so local rank l uses cuda:l
    of that slice. Needs nodes x ranks_per_node GPUs on this machine. Off: every rank sees
    every GPU and local rank l uses cuda:l (right for one virtual node)."""

    def node_names(self) -> list[str]:
        return [f"{self.node_prefix}{i}" for i in range(self.nodes)]

    def launch_options(self) -> LaunchOptions:
        """Every rank gets an equal share of this machine's cores, as ranks on separate nodes
        would: without it each rank's intra-op pool takes every core and they thrash."""
        share = max(1, (os.cpu_count() or 1) // (self.nodes * self.ranks_per_node))
        wrapper = gpu_wrapper(self.node_prefix, self.ranks_per_node) if self.bind_gpus else ()
        return LaunchOptions(env={"OMP_NUM_THREADS": str(share)}, wrapper=wrapper)

    def devices(self) -> tuple[str, int | None]:
        return ("cuda", self.ranks_per_node) if self.bind_gpus else ("cpu", None)

    def block_walltime_s(self) -> float | None:
        return self.walltime_s

    @property
    def deadline_from(self) -> Literal["block", "attempt"]:
        """The simulated walltime counts from each attempt's start (there is no real block)."""
        return "attempt"

    @property
    def launcher(self) -> str:
        return "local"

    def parsl_config(self, run_dir: Path) -> Config:
        """A fresh Parsl Config: a LocalProvider block of one worker running the supervisor app."""
        return _parsl_config(run_dir)


def gpu_wrapper(prefix: str, ranks_per_node: int) -> tuple[str, ...]:
    """Argv prefix that shows a rank of virtual node `<prefix>i` only that node's GPUs.

    The node's index comes from CAMPAIGN_NODE (set per rank by the local launcher), not from
    the rank, so a node keeps its GPUs when another node is excluded and spares take over.
    """
    script = (f'i=${{CAMPAIGN_NODE#{prefix}}}; f=$((i * {ranks_per_node})); '
              f'export CUDA_VISIBLE_DEVICES=$(seq -s, $f $((f + {ranks_per_node} - 1))); exec "$@"')
    return ("bash", "-c", script, "bind_gpus")


def _parsl_config(run_dir: Path) -> Config:
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from parsl.launchers import SimpleLauncher
    from parsl.providers import LocalProvider

    # Workers must find this interpreter's process_worker_pool.py even when the user
    # ran .venv/bin/campaign without activating the venv.
    bindir = parsl_scripts_dir()
    worker_init = f"export PATH={bindir}:$PATH"
    executor = HighThroughputExecutor(
        label=LABEL,
        interchange_launch_cmd=interchange_command(bindir),
        address="127.0.0.1",
        max_workers_per_node=1,
        cores_per_worker=1,
        # Interchange and worker pool share this host: a worker pool whose driver was killed
        # (its interchange gone with it) exits after 10 s of silence, not 30 s; a pool stalled
        # that long by the scheduler is not a risk one host runs.
        heartbeat_period=2,
        heartbeat_threshold=10,
        provider=LocalProvider(
            init_blocks=1, min_blocks=0, max_blocks=1, launcher=SimpleLauncher(), worker_init=worker_init
        ),
    )
    return Config(
        executors=[executor],
        run_dir=str(run_dir),
        strategy="none",
        strategy_period=1,  # the first block starts at the first poll: do not wait the default 5 s
        usage_tracking=0,
        initialize_logging=True,
    )
