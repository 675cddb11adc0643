"""Where a rank runs: its rank numbers from the launcher's variables, and its device.

One pure function, standard library only (the driver imports it without torch):

    p = placement(os.environ, visible_devices=torch.cuda.device_count(), device_type="cuda")
    torch.cuda.set_device(p.device_index)

**Rank numbers.** The first launcher whose variables are present wins, most specific first:

| source        | rank / world size                    | local rank / local size                      |
|---------------|--------------------------------------|----------------------------------------------|
| `torchrun`    | RANK, WORLD_SIZE                     | LOCAL_RANK, LOCAL_WORLD_SIZE                 |
| `pals`        | PALS_RANKID or PMI_RANK, PALS_SIZE or PMI_SIZE | PALS_LOCAL_RANKID or PMI_LOCAL_RANK, PALS_LOCAL_SIZE or PMI_LOCAL_SIZE |
| `pals-pmix`   | PALS_RANKID or PMIX_RANK; size: hostfile nodes x ranks per node | PALS_LOCAL_RANKID; PALS_LOCAL_SIZE or CAMPAIGN_RANKS_PER_NODE |
| `mpich`       | PMI_RANK, PMI_SIZE                   | MPI_LOCALRANKID, MPI_LOCALNRANKS (Hydra)     |
| `openmpi`     | OMPI_COMM_WORLD_RANK, _SIZE          | OMPI_COMM_WORLD_LOCAL_RANK, _LOCAL_SIZE      |
| `slurm[-pmi2\\|-pmix]` | SLURM_PROCID, SLURM_STEP_NUM_TASKS or SLURM_NTASKS | SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE (by SLURM_NODEID) |

Sources: ALCF's `gpu_tile_compact.sh` and affinity examples
(https://docs.alcf.anl.gov/aurora/running-jobs-aurora/) for PALS. **Aurora runs PALS with
PMIx** (Cray PALS 1.8.0 "built ... against PMIX 4.2.9", ALCF's Aurora system updates): a rank
there has `PMIX_RANK` and `PALS_LOCAL_RANKID` but neither `PALS_SIZE` nor `PMI_SIZE`. ALCF's
own scripts read exactly those two (the `frameworks` binding script: `gpu_id=$((PMIX_RANK %
${num_gpus} ))`; `gpu_tile_compact.sh` and the PyTorch DDP example: `PALS_LOCAL_RANKID`) and
size the job as `NNODES=`wc -l < $PBS_NODEFILE`` times ranks per node (the job templates on
the same pages; docs/sites.md quotes them). So does `pals-pmix`: the world is the nodes of
the launch's hostfile (`CAMPAIGN_HOSTFILE`, which the supervisor writes and hands to
`mpiexec --hostfile`; else `PBS_NODEFILE`) times the ranks per node (`PALS_LOCAL_SIZE`, else
`CAMPAIGN_RANKS_PER_NODE`, which every launch sets). MPICH Hydra's
`MPI_LOCALRANKID`/`MPI_LOCALNRANKS` (checked with Debian's mpich, tests/unit/test_launchers.py);
Open MPI's mpirun(1) "Exported Environment Variables"; srun(1) "OUTPUT ENVIRONMENT VARIABLES"
(https://slurm.schedmd.com/srun.html); torchrun
(https://docs.pytorch.org/docs/stable/elastic/run.html). Slurm's PMI2 plugin
(src/plugins/mpi/pmi2/mpi_pmi2.c) also exports PMI_RANK/PMI_SIZE but no local rank, so
under `srun --mpi=pmi2` the Slurm variables must win over a bare PMI_RANK (the old reader
took PMI_RANK and every rank of a node got local rank 0, hence GPU 0). A bare
PMI_RANK/PMI_SIZE with more than one rank and no local rank anywhere is an error: the
local rank cannot be known.

**Device.** Whatever the launcher or a wrapper left visible decides
(CUDA_VISIBLE_DEVICES for `cuda`; ZE_AFFINITY_MASK for `xpu`, or the runtime's count):

* exactly one visible device: device 0 (Polaris' `set_affinity_gpu_polaris.sh`, PALS
  `--gpu-bind`, `gpu_tile_compact.sh`: each rank sees only its own GPU or tile);
* `local_world_size` or more: device `local_rank` (Aurora FLAT: 12 tiles as 12 devices);
* fewer: `local_rank % visible` only where ranks may share a device evenly (xpu, FLAT,
  e.g. several Compute Command Streamers per tile); refused for cuda (NCCL refuses two
  ranks of one communicator on one GPU: "Duplicate GPU detected"), for xpu in COMPOSITE
  (a rank would drive a whole two-tile GPU that another rank also drives), and where the
  ranks do not divide evenly.

Aurora's hierarchy (ZE_FLAT_DEVICE_HIERARCHY, https://www.intel.com/content/www/us/en/developer/articles/technical/flattening-gpu-tile-hierarchy.html):
FLAT shows the 12 tiles as 12 devices and mask entries are device numbers (`5`); COMPOSITE
shows 6 GPUs with 2 tiles each and mask entries may name a tile (`0.1`); a COMPOSITE mask
`0.0,0.1` is one device with two tiles. Unset means FLAT (the driver default since 2023).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Placement",
    "PlacementError",
    "device_index",
    "first_node_placement",
    "launch_placement",
    "placement",
    "polaris_wrapper_env",
    "visible_count",
]

RANKS_PER_NODE_VAR = "CAMPAIGN_RANKS_PER_NODE"
"""Ranks per node of the launch, set on every rank (PALS in PMIx mode gives no size)."""
HOSTFILE_VARS = ("CAMPAIGN_HOSTFILE", "PBS_NODEFILE")
"""Files listing the launch's nodes, one per line: the launch's own first, then the job's."""
VISIBLE_VAR = {"cuda": "CUDA_VISIBLE_DEVICES", "xpu": "ZE_AFFINITY_MASK"}
"""The variable through which a launcher or wrapper narrows the devices a rank sees."""
HIERARCHY_VAR = "ZE_FLAT_DEVICE_HIERARCHY"


class PlacementError(ValueError):
    """The environment does not say where this rank runs, or says something surely wrong."""


@dataclass(frozen=True)
class Placement:
    """One rank: its numbers, the launcher they came from, and its device index."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device_index: int | None
    """Index to pass to `set_device` (None on cpu)."""
    visible: int | None
    """Devices this rank sees (None: not known, nothing narrowed them)."""
    source: str
    """Which launcher's variables gave the numbers: torchrun, pals, pals-pmix, mpich, openmpi, slurm,
    slurm-pmi2, slurm-pmix, pmi, single."""
    device_type: str = "cpu"

    @property
    def device(self) -> str:
        """`cuda:3`, `xpu:0` or `cpu`."""
        return self.device_type if self.device_index is None else f"{self.device_type}:{self.device_index}"


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise PlacementError(f"{name}={env[name]!r} is not a whole number") from None


def _first(env: Mapping[str, str], *names: str) -> str | None:
    return next((n for n in names if env.get(n, "") != ""), None)


def _tasks_on_node(spec: str, node: int) -> int:
    """Slurm's compressed per-node task counts (`4(x2),3`) at node index `node`."""
    counts: list[int] = []
    for part in spec.split(","):
        num, _, rep = part.partition("(x")
        counts += [int(num)] * (int(rep.rstrip(")")) if rep else 1)
    return counts[min(node, len(counts) - 1)]


def _hostfile_nodes(env: Mapping[str, str]) -> tuple[int, str] | None:
    """(distinct nodes, variable) of the first hostfile the environment names, or None."""
    var = _first(env, *HOSTFILE_VARS)
    if var is None:
        return None
    try:
        with open(env[var]) as f:
            nodes = {line.split()[0] for line in f if line.strip()}
    except OSError as e:
        raise PlacementError(f"{var}={env[var]}: cannot read the hostfile ({e.strerror or e})") from None
    if not nodes:
        raise PlacementError(f"{var}={env[var]}: the hostfile lists no node")
    return len(nodes), var


def _pmix_world(env: Mapping[str, str], lsize: str | None, nodes: int | None) -> tuple[int, int]:
    """(world, ranks per node) under PALS in PMIx mode, which gives no size: the launch's nodes
    times its ranks per node, as ALCF's job scripts compute it (module docstring)."""
    per_node_var = lsize or _first(env, RANKS_PER_NODE_VAR)
    counted = (nodes, "the dry run") if nodes is not None else _hostfile_nodes(env)
    if per_node_var is None or counted is None:
        lacking = [what for what, ok in ((f"{RANKS_PER_NODE_VAR} (or PALS_LOCAL_SIZE)", per_node_var),
                                         (" or ".join(HOSTFILE_VARS), counted)) if ok is None]
        raise PlacementError(f"pals-pmix: PALS in PMIx mode gives no world size (no PALS_SIZE or PMI_SIZE); "
                             f"it is nodes x ranks per node, but {' and '.join(lacking)} is not set")
    per_node = _int(env, per_node_var)
    if per_node < 1:
        raise PlacementError(f"{per_node_var}={per_node}: ranks per node must be >= 1")
    return counted[0] * per_node, per_node


def _ranks(env: Mapping[str, str], nodes: int | None = None) -> tuple[int, int, int | None, int | None, str]:
    """(rank, world, local rank or None, local size or None, source)."""
    has = lambda *names: _first(env, *names) is not None  # noqa: E731
    if has("RANK") and has("WORLD_SIZE"):
        loc, lsize = _first(env, "LOCAL_RANK"), _first(env, "LOCAL_WORLD_SIZE")
        return (_int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, loc) if loc else None,
                _int(env, lsize) if lsize else None, "torchrun")
    if has("PALS_RANKID", "PALS_LOCAL_RANKID", "PMI_LOCAL_RANK"):
        rank, size = _first(env, "PALS_RANKID", "PMI_RANK", "PMIX_RANK"), _first(env, "PALS_SIZE", "PMI_SIZE")
        loc, lsize = _first(env, "PALS_LOCAL_RANKID", "PMI_LOCAL_RANK"), _first(env, "PALS_LOCAL_SIZE", "PMI_LOCAL_SIZE")
        if rank and size:
            return (_int(env, rank), _int(env, size), _int(env, loc) if loc else None,
                    _int(env, lsize) if lsize else None, "pals")
        if rank and loc:  # Aurora: PALS in PMIx mode
            world, per_node = _pmix_world(env, lsize, nodes)
            return _int(env, rank), world, _int(env, loc), per_node, "pals-pmix"
    if has("MPI_LOCALRANKID") and has("PMI_RANK") and has("PMI_SIZE"):
        lsize = _first(env, "MPI_LOCALNRANKS")
        return (_int(env, "PMI_RANK"), _int(env, "PMI_SIZE"), _int(env, "MPI_LOCALRANKID"),
                _int(env, lsize) if lsize else None, "mpich")
    if has("OMPI_COMM_WORLD_RANK") and has("OMPI_COMM_WORLD_SIZE"):
        loc, lsize = _first(env, "OMPI_COMM_WORLD_LOCAL_RANK"), _first(env, "OMPI_COMM_WORLD_LOCAL_SIZE")
        return (_int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE"), _int(env, loc) if loc else None,
                _int(env, lsize) if lsize else None, "openmpi")
    if has("SLURM_PROCID") and has("SLURM_LOCALID"):
        rank = _int(env, "SLURM_PROCID")
        # An srun task's own PMI rank equals its SLURM_PROCID; a different one means the Slurm
        # variables were inherited from an outer step (e.g. a launcher bootstrapped by srun).
        pmi = [n for n in ("PMI_RANK", "PMIX_RANK") if has(n)]
        if all(_int(env, n) == rank for n in pmi):
            size = _first(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS", "PMI_SIZE")
            per_node = _first(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
            node = int(env.get("SLURM_NODEID") or 0)
            source = {"PMI_RANK": "slurm-pmi2", "PMIX_RANK": "slurm-pmix"}.get(pmi[0], "slurm") if pmi else "slurm"
            if size:
                lsize = _tasks_on_node(env[per_node], node) if per_node else None
                return rank, _int(env, size), _int(env, "SLURM_LOCALID"), lsize, source
    if has("PMI_RANK") and has("PMI_SIZE"):
        return _int(env, "PMI_RANK"), _int(env, "PMI_SIZE"), None, None, "pmi"
    if has("PMIX_RANK"):
        raise PlacementError("PMIX_RANK is set but no launcher variables give the world size and local rank "
                             "(PALS_*, SLURM_*, OMPI_COMM_WORLD_*): set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE")
    return 0, 1, 0, 1, "single"


def visible_count(env: Mapping[str, str], device_type: str) -> int | None:
    """Devices the visibility variable leaves (None: the variable is unset, nothing narrowed)."""
    var = VISIBLE_VAR.get(device_type)
    if var is None or var not in env:
        return None
    value = env[var].strip()
    if device_type == "xpu":
        if not value:
            return None  # an empty mask masks nothing
        entries = [e.strip() for e in value.split(",") if e.strip()]
        if env.get(HIERARCHY_VAR, "FLAT").upper() == "COMPOSITE":
            return len({e.split(".")[0] for e in entries})  # `0.0,0.1`: one GPU with two tiles
        return len(set(entries))
    # CUDA stops at the first invalid entry: "" and "-1" hide every GPU.
    n = 0
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        n += 1
    return n


def device_index(local_rank: int, local_world_size: int, visible: int | None, device_type: str,
                 hierarchy: str = "FLAT") -> int | None:
    """The device rule (module docstring); PlacementError where it is surely wrong."""
    if device_type not in VISIBLE_VAR:
        return None
    if visible is None:
        return local_rank
    var = VISIBLE_VAR[device_type]
    if visible <= 0:
        raise PlacementError(f"no {device_type} device is visible to local rank {local_rank} (check {var})")
    if visible == 1:
        return 0
    if visible >= local_world_size:
        return local_rank
    what = f"{local_world_size} ranks on this node but only {visible} {device_type} devices visible to each"
    if device_type == "cuda":
        raise PlacementError(f"{what}: NCCL refuses two ranks of one launch on one GPU; launch one rank per GPU "
                             f"(ranks_per_node <= {visible}) or give each rank its own GPU ({var})")
    if hierarchy.upper() == "COMPOSITE":
        raise PlacementError(f"{what} with {HIERARCHY_VAR}=COMPOSITE (each device is a whole two-tile GPU): set "
                             f"{HIERARCHY_VAR}=FLAT (one device per tile) or bind one tile per rank (--gpu-bind)")
    if local_world_size % visible:
        raise PlacementError(f"{what}: they cannot share the devices evenly")
    return local_rank % visible


def placement(env: Mapping[str, str], visible_devices: int | None = None, device_type: str = "cpu", *,
              nodes: int | None = None) -> Placement:
    """This rank's placement from the launcher's variables in `env`.

    `visible_devices`: the runtime's device count (e.g. `torch.cuda.device_count()`) when
    known; else the count the visibility variable implies; else unknown (None). `nodes`:
    the launch's node count where no hostfile exists yet (the dry run); else the hostfile's.
    """
    rank, world, local, lsize, source = _ranks(env, nodes)
    if local is None:
        if world != 1:
            raise PlacementError(
                f"{source}: rank {rank} of {world}, but no variable gives the local rank (PMI_RANK/PMI_SIZE alone, "
                "as srun --mpi=pmi2 exports, need SLURM_LOCALID; mpiexec needs PALS_LOCAL_RANKID or "
                "MPI_LOCALRANKID); set LOCAL_RANK and LOCAL_WORLD_SIZE")
        local = 0
    # Unknown local size: report the world (as many ranks as could share this node's cores),
    # but judge the device by what is known: ranks 0..local_rank are here.
    known_lsize = lsize
    if lsize is None:
        lsize = world
    if not (0 <= rank < world and 0 <= local < lsize <= world):
        raise PlacementError(f"{source}: inconsistent ranks: rank {rank} of {world}, local rank {local} of {lsize}")
    visible = visible_devices if visible_devices is not None else visible_count(env, device_type)
    idx = device_index(local, known_lsize or local + 1, visible, device_type, env.get(HIERARCHY_VAR, "FLAT"))
    return Placement(rank, local, world, lsize, idx, visible, source, device_type)


# ---- the dry run: what every local rank of the first node will get --------------------------------


def polaris_wrapper_env(local_rank: int) -> dict[str, str]:
    """What executors.polaris.GPU_WRAPPER exports (`3 - PMI_LOCAL_RANK % 4`)."""
    return {"CUDA_VISIBLE_DEVICES": str(3 - local_rank % 4)}


_WRAPPERS: dict[str, Callable[[int], dict[str, str]]] = {"set_affinity_gpu_polaris": polaris_wrapper_env}
"""Known wrappers by their argv0 name (the argument after `bash -c SCRIPT`)."""


def _cpu_sets(cpu_bind: str | None, depth: int | None, ranks: int) -> list[str | None]:
    if cpu_bind and cpu_bind.startswith("list:"):
        sets = cpu_bind.removeprefix("list:").split(":")
        return [sets[i % len(sets)] for i in range(ranks)]  # PALS reuses the list round-robin
    if cpu_bind == "depth" and depth:
        return [f"{i * depth}-{(i + 1) * depth - 1}" for i in range(ranks)]
    return [None] * ranks


RANK_ENV_STYLES = ("torchrun", "pals", "pals-pmix", "mpich", "srun")


def rank_environment(style: str, rank: int, local: int, per_node: int, world: int) -> dict[str, str]:
    """The rank variables a launcher gives rank `rank` (local rank `local`), and no more, as its
    documentation says (module docstring): what the dry run feeds to `placement`. `pals-pmix`
    is Aurora's PALS: only the two variables ALCF's scripts read, and the ranks per node that
    every launch sets; `pals` is Polaris' (Cray PMI names)."""
    if style == "torchrun":  # also the local launcher's
        return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local),
                "LOCAL_WORLD_SIZE": str(per_node)}
    if style == "pals-pmix":
        return {"PMIX_RANK": str(rank), "PALS_LOCAL_RANKID": str(local), RANKS_PER_NODE_VAR: str(per_node)}
    if style == "pals":
        return {"PALS_RANKID": str(rank), "PALS_LOCAL_RANKID": str(local), "PMI_RANK": str(rank),
                "PMI_SIZE": str(world), "PMI_LOCAL_RANK": str(local), "PMI_LOCAL_SIZE": str(per_node)}
    if style == "mpich":
        return {"PMI_RANK": str(rank), "PMI_SIZE": str(world), "MPI_LOCALRANKID": str(local),
                "MPI_LOCALNRANKS": str(per_node)}
    if style == "srun":
        return {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local), "SLURM_NODEID": str(rank // per_node),
                "SLURM_STEP_NUM_TASKS": str(world), "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x{world // per_node})"}
    raise ValueError(f"unknown rank environment {style!r}; known: {', '.join(RANK_ENV_STYLES)}")


def first_node_placement(ranks_per_node: int, cpu_bind: str | None = None, gpu_bind: str | None = None,
                         visible_env: Mapping[str, str] | Callable[[int], Mapping[str, str]] | None = None,
                         flat: bool = True, *, depth: int | None = None, device_type: str = "xpu",
                         node_devices: int | None = None, rank_env: str = "torchrun",
                         nodes: int = 1) -> list[dict[str, Any]]:
    """`[{local_rank, rank, world_size, local_world_size, cpus, visible_devices, device}]` for
    the first node of a launch on `nodes` nodes.

    `cpu_bind`/`depth`: PALS `--cpu-bind` (`list:a-b:c-d...` or `depth` with `--depth`);
    `gpu_bind`: PALS `--gpu-bind=list:...` (sets ZE_AFFINITY_MASK per rank); `visible_env`:
    the variables a wrapper or the launch sets, fixed or per local rank; `flat`: Aurora's
    ZE_FLAT_DEVICE_HIERARCHY; `node_devices`: devices a node shows when nothing narrows
    them (Aurora: 12 FLAT, 6 COMPOSITE; Polaris: 4); `rank_env`: whose rank variables the
    ranks get (`rank_environment`). The world size is what each rank computes from them. A
    rank whose numbers or device cannot be decided gets `device: None` and an `error`.
    """
    cpus = _cpu_sets(cpu_bind, depth, ranks_per_node)
    binds = gpu_bind.removeprefix("list:").split(":") if gpu_bind else []
    hierarchy = "FLAT" if flat else "COMPOSITE"
    out: list[dict[str, Any]] = []
    for i in range(ranks_per_node):
        env = {**rank_environment(rank_env, i, i, ranks_per_node, nodes * ranks_per_node), HIERARCHY_VAR: hierarchy}
        extra = visible_env(i) if callable(visible_env) else (visible_env or {})
        env.update(extra)
        if binds:
            env["ZE_AFFINITY_MASK"] = binds[i % len(binds)]
        var = VISIBLE_VAR.get(device_type, "")
        narrowed = var in env
        row: dict[str, Any] = {"local_rank": i, "cpus": cpus[i],
                               "visible_devices": env[var] if narrowed else "all"}
        if gpu_bind and flat and device_type == "xpu":
            row.update(device=None, error="PALS --gpu-bind fails with ZE_FLAT_DEVICE_HIERARCHY=FLAT "
                       "(https://docs.alcf.anl.gov/aurora/running-jobs-aurora/): drop gpu_bind or use COMPOSITE")
        else:
            try:
                p = placement(env, None if narrowed else node_devices, device_type, nodes=nodes)
                row.update(rank=p.rank, world_size=p.world_size, local_world_size=p.local_world_size,
                           rank_source=p.source, device=p.device)
            except PlacementError as e:
                row.update(device=None, error=str(e))
        out.append(row)
    return out


def launch_placement(launch: Any, ranks_per_node: int, device_type: str,
                     node_devices: int | None = None, *, rank_env: str = "torchrun",
                     nodes: int = 1) -> list[dict[str, Any]]:
    """`first_node_placement` from a launch's options: anything with `env`, `wrapper`,
    `cpu_bind`, `gpu_bind` and `depth` attributes (`executors.base.LaunchOptions`,
    `campaign.attempt.AttemptRequest`): what `campaign submit --dry-run` shows per local rank."""
    env: dict[str, str] = dict(launch.env or {})
    wrapper: Sequence[str] = tuple(launch.wrapper or ())
    wrap = _WRAPPERS.get(wrapper[3]) if len(wrapper) > 3 and tuple(wrapper[:2]) == ("bash", "-c") else None
    if wrapper and wrap is None:
        raise PlacementError(f"unknown wrapper {list(wrapper)!r}: cannot tell which devices it leaves visible")
    flat = env.get(HIERARCHY_VAR, "FLAT").upper() != "COMPOSITE"

    def visible(i: int) -> dict[str, str]:
        return {**env, **(wrap(i) if wrap else {})}

    return first_node_placement(ranks_per_node, launch.cpu_bind, launch.gpu_bind, visible, flat,
                                depth=launch.depth, device_type=device_type, node_devices=node_devices,
                                rank_env=rank_env, nodes=nodes)
