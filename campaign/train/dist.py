"""The one module that reads the distributed environment (like nanochat's compute_init).

Rank, world size, local rank and the device index come from `campaign.train.placement`
(stdlib only, shared with the driver's dry run): torchrun, PALS, MPICH Hydra,
Open MPI or Slurm (srun with --mpi=none/pmi2/pmix) variables; none of them: a single
process. The device index honours what the launcher or a wrapper left visible (one
visible GPU: device 0). MASTER_ADDR: the environment, else the first line of
CAMPAIGN_HOSTFILE; MASTER_PORT: the environment, else CAMPAIGN_MASTER_PORT, else 29500.
"""

from __future__ import annotations

import datetime
import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from campaign import report
from campaign.train import placement

# NVLink multicast can take a shared host's GPUs out of service: keep it off.
_CUDA_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
             "NVSHMEM_DISABLE_NVLS": "1",
             # Lets parallelize.CommTimer read NCCL collective durations from CUDA events.
             "TORCH_NCCL_ENABLE_TIMING": "1"}


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: str
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def read_ranks(env: dict[str, str] | None = None) -> tuple[int, int, int, int]:
    """(rank, world_size, local_rank, local_world_size) from the launcher's variables."""
    p = placement.placement(os.environ if env is None else env)
    return p.rank, p.world_size, p.local_rank, p.local_world_size


def master_addr_port(env: dict[str, str] | None = None) -> tuple[str, str]:
    env = dict(os.environ if env is None else env)
    addr = env.get("MASTER_ADDR")
    if not addr and env.get("CAMPAIGN_HOSTFILE"):
        with open(env["CAMPAIGN_HOSTFILE"]) as f:
            addr = next((line.split()[0] for line in f if line.strip()), None)
    port = env.get("MASTER_PORT") or env.get("CAMPAIGN_MASTER_PORT") or "29500"
    return addr or "127.0.0.1", port


def pick_device(kind: str = "auto") -> str:
    if kind != "auto":
        return kind
    if torch.cuda.is_available():
        return "cuda"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    return "cpu"


def pick_backend(device_type: str, backend: str = "auto") -> str:
    if backend != "auto":
        return backend
    return {"cuda": "nccl", "xpu": "xccl"}.get(device_type, "gloo")


def init(device: str = "auto", backend: str = "auto", timeout_s: float = 1800) -> DistEnv:
    """Set the device of this local rank, then init the process group (always, even W=1)."""
    dtype = pick_device(device)
    count = {"cuda": lambda: torch.cuda.device_count(), "xpu": lambda: torch.xpu.device_count()}.get(dtype)
    # Raises PlacementError (a ValueError: exit 93, do not retry) where the device is surely wrong.
    where = placement.placement(os.environ, count() if count else None, dtype)
    rank, world, local_rank, local_world = where.rank, where.world_size, where.local_rank, where.local_world_size
    if dtype == "cuda":
        for k, v in _CUDA_ENV.items():
            os.environ.setdefault(k, v)
        torch.cuda.set_device(where.device_index)
        dev = torch.device("cuda", where.device_index)
    elif dtype == "xpu":
        torch.xpu.set_device(where.device_index)
        dev = torch.device("xpu", where.device_index)
    else:
        dev = torch.device("cpu")
        # Share the cores between the node's ranks instead of oversubscribing them; the
        # launcher's OMP_NUM_THREADS wins (the local site shares one machine between nodes).
        share = int(os.environ.get("OMP_NUM_THREADS") or 0) or (os.cpu_count() or 1) // max(1, local_world)
        torch.set_num_threads(max(1, share))
    be = pick_backend(dtype, backend)
    timeout = datetime.timedelta(seconds=timeout_s)
    if world == 1:
        # No rendezvous needed: a private store avoids port clashes between single runs.
        dist.init_process_group(be, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout,
                                device_id=dev if dtype != "cpu" else None)
    else:
        addr, port = master_addr_port()
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, port
        dist.init_process_group(be, init_method=f"tcp://{addr}:{port}", rank=rank,
                                world_size=world, timeout=timeout,
                                device_id=dev if dtype != "cpu" else None)
    return DistEnv(rank, world, local_rank, local_world, report.node_name(), dev, be)


def startup_check(env: DistEnv) -> dict:
    """Gather every rank's identity and all-reduce rank+1 (SUM); the startup.json document."""
    ranks: list = [None] * env.world_size
    dist.all_gather_object(ranks, report.rank_identity(env.rank, env.local_rank, env.device))
    t = torch.tensor([report.allreduce_input(env.rank)], dtype=torch.float64, device=env.device)
    dist.all_reduce(t)
    w = env.world_size
    return {"world_size": w, "ranks": ranks,
            "allreduce": {"got": float(t.item()), "expected": float(w * (w + 1) // 2)}}


def teardown() -> None:
    """Destroy the process group, after collecting garbage: a DDP/FSDP module that a reference
    cycle keeps alive still holds the group, whose gloo threads would then be torn down during
    interpreter exit, which now and then aborts the process ("terminate called without an
    active exception", exit 134). Measured with examples/trainers/train_ddp.py, two ranks on
    CPU: 7 of 95 launches aborted so; 0 of 80 with the model released before the destroy."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
