"""The one module that reads the distributed environment (like nanochat's compute_init).

Rank, world size and local rank come from, in order: torchrun (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE), PMI/PALS from mpiexec (PMI_RANK, PMI_SIZE,
PALS_LOCAL_RANKID or MPI_LOCALRANKID, PALS_LOCAL_SIZE or MPI_LOCALNRANKS), Slurm
(SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE); none of them: a single
process. MASTER_ADDR: the environment, else the first line of CAMPAIGN_HOSTFILE;
MASTER_PORT: the environment, else CAMPAIGN_MASTER_PORT, else 29500.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from campaign import report

_SOURCES = (
    ("RANK", "WORLD_SIZE", ("LOCAL_RANK",), ("LOCAL_WORLD_SIZE",)),
    ("PMI_RANK", "PMI_SIZE", ("PALS_LOCAL_RANKID", "MPI_LOCALRANKID"),
     ("PALS_LOCAL_SIZE", "MPI_LOCALNRANKS")),
    ("SLURM_PROCID", "SLURM_NTASKS", ("SLURM_LOCALID",), ("SLURM_NTASKS_PER_NODE",)),
)

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


def _first(env: dict[str, str], names: tuple[str, ...]) -> str | None:
    return next((env[n] for n in names if env.get(n)), None)


def read_ranks(env: dict[str, str] | None = None) -> tuple[int, int, int, int]:
    """(rank, world_size, local_rank, local_world_size) from the launcher's variables."""
    env = dict(os.environ if env is None else env)
    for rank_var, size_var, local_vars, local_size_vars in _SOURCES:
        if env.get(rank_var) and env.get(size_var):
            rank, world = int(env[rank_var]), int(env[size_var])
            local = _first(env, local_vars)
            # SLURM_NTASKS_PER_NODE may read "4(x2)"; keep the leading number.
            lsize = (_first(env, local_size_vars) or str(world)).split("(")[0].split(",")[0]
            return rank, world, int(local) if local is not None else 0, int(lsize)
    return 0, 1, 0, 1


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
    rank, world, local_rank, local_world = read_ranks()
    dtype = pick_device(device)
    if dtype == "cuda":
        for k, v in _CUDA_ENV.items():
            os.environ.setdefault(k, v)
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    elif dtype == "xpu":
        torch.xpu.set_device(local_rank)
        dev = torch.device("xpu", local_rank)
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
    me = {"rank": env.rank, "local_rank": env.local_rank, "node": env.node,
          "host": socket.gethostname(), "device": str(env.device)}
    ranks: list = [None] * env.world_size
    dist.all_gather_object(ranks, me)
    t = torch.tensor([float(env.rank + 1)], dtype=torch.float64, device=env.device)
    dist.all_reduce(t)
    w = env.world_size
    return {"world_size": w, "ranks": ranks,
            "allreduce": {"got": float(t.item()), "expected": float(w * (w + 1) // 2)}}


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
