"""Launchers as data: a ``LaunchPlan`` and the exact command each launcher runs for it.

A :class:`LaunchPlan` says *what* to start (hosts in rank order, ranks per node, the
trainer's argv, environment, CPU/GPU binding); :func:`build_command` turns it into the
argv of one launcher (``pals``, ``mpich``, ``srun``, ``torchrun``) and
:func:`local_rank_processes` into one (argv, env) pair per rank for the ``local``
launcher. Nothing here runs anything or touches the filesystem, so every site can show
the exact command before spending an allocation (``campaign submit --dry-run``, see
:func:`render`).

Binding strings are passed through in the launcher's own syntax (PALS ``--cpu-bind``,
Hydra ``-bind-to``, Slurm ``--cpu-bind``). Site presets (Aurora's CPU and GPU binding,
Polaris' GPU affinity wrapper) live with their site: ``executors/aurora.py``,
``executors/polaris.py``, each with the ALCF page it follows.

NVIDIA-only settings (e.g. :data:`NVIDIA_NO_MULTICAST_ENV`) are not added implicitly:
the caller puts them into ``LaunchPlan.env``.

Standard library only, no intra-package imports.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_MASTER_PORT",
    "KNOWN_LAUNCHERS",
    "LaunchPlan",
    "NVIDIA_NO_MULTICAST_ENV",
    "build_command",
    "local_rank_processes",
    "render",
    "shell_join",
]

KNOWN_LAUNCHERS: tuple[str, ...] = ("local", "mpich", "pals", "srun", "torchrun")
DEFAULT_MASTER_PORT = 29500  # torch.distributed's default

# For single-host NVIDIA machines without NVLink multicast; the caller adds these to env.
NVIDIA_NO_MULTICAST_ENV: tuple[tuple[str, str], ...] = (
    ("NCCL_NVLS_ENABLE", "0"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
)

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_HOST = re.compile(r"[A-Za-z0-9_.\-]+\Z")  # no commas or blanks: host lists are joined
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?\Z")


@dataclass(frozen=True)
class LaunchPlan:
    """What to launch: ``world_size = len(hosts) * ranks_per_node`` ranks, block placed.

    Rank ``r`` lives on ``hosts[r // ranks_per_node]`` with local rank
    ``r % ranks_per_node``. ``env`` is normalised to sorted ``(key, value)`` pairs (a
    mapping is accepted too). ``hostfile`` is a file listing ``hosts``, one per line,
    written by the caller (only PALS reads it; the other launchers take ``hosts``).
    ``exclude`` names nodes Slurm must avoid; ``wrapper`` is an argv prefix placed
    before ``argv`` on every rank (e.g. Polaris' ``GPU_WRAPPER``). ``taskfile`` (srun) is a
    file listing ``rank_hosts``, one per line, written by the caller: srun then places rank
    ``r`` on ``host_of(r)`` (without it srun sorts the node list).
    """

    hosts: tuple[str, ...]
    ranks_per_node: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    hostfile: str | None = None
    cpu_bind: str | None = None
    depth: int | None = None
    gpu_bind: str | None = None
    master_port: int | None = None
    exclude: tuple[str, ...] = ()
    wrapper: tuple[str, ...] = ()
    taskfile: str | None = None

    def __post_init__(self) -> None:
        for name in ("hosts", "argv", "exclude", "wrapper"):
            object.__setattr__(self, name, _str_tuple(name, getattr(self, name)))
        object.__setattr__(self, "env", _normalise_env(self.env))
        _check_hosts(self.hosts, self.exclude)
        _check_int("ranks_per_node", self.ranks_per_node, 1, None)
        if self.depth is not None:
            _check_int("depth", self.depth, 1, None)
        if self.master_port is not None:
            _check_int("master_port", self.master_port, 1, 65535)
        if not self.argv:
            raise ValueError("argv must not be empty")

    @property
    def world_size(self) -> int:
        """Total number of ranks."""
        return len(self.hosts) * self.ranks_per_node

    @property
    def nnodes(self) -> int:
        """Number of active nodes."""
        return len(self.hosts)

    @property
    def rank_hosts(self) -> tuple[str, ...]:
        """The host of each rank, in rank order (a taskfile's lines)."""
        return tuple(host for host in self.hosts for _ in range(self.ranks_per_node))

    def host_of(self, rank: int) -> str:
        """The host that rank ``rank`` runs on."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside 0..{self.world_size - 1}")
        return self.hosts[rank // self.ranks_per_node]


def _str_tuple(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        raise ValueError(f"{name} must be a sequence of strings, not one string")
    items = tuple(value)
    if not all(isinstance(item, str) and item for item in items):
        raise ValueError(f"{name} must hold non-empty strings: {items!r}")
    return items


def _normalise_env(env: Any) -> tuple[tuple[str, str], ...]:
    pairs = list(env.items()) if isinstance(env, Mapping) else [tuple(p) for p in env]
    for pair in pairs:
        if len(pair) != 2 or not all(isinstance(x, str) for x in pair):
            raise ValueError(f"env entries must be (str, str) pairs: {pair!r}")
        if not _ENV_KEY.match(pair[0]):
            raise ValueError(f"invalid environment variable name: {pair[0]!r}")
    keys = [key for key, _ in pairs]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise ValueError(f"duplicate environment variables: {duplicates}")
    return tuple(sorted(pairs))


def _check_hosts(hosts: tuple[str, ...], exclude: tuple[str, ...]) -> None:
    if not hosts:
        raise ValueError("hosts must not be empty")
    bad = [h for h in (*hosts, *exclude) if not _HOST.match(h)]
    if bad:
        raise ValueError(f"invalid host names (no blanks or commas): {bad}")
    duplicates = sorted(h for h, n in Counter(hosts).items() if n > 1)  # linear: 10,624 hosts
    if duplicates:
        raise ValueError(f"duplicate hosts: {duplicates}")
    overlap = sorted(set(hosts) & set(exclude))
    if overlap:
        raise ValueError(f"hosts are also excluded: {overlap}")


def _check_int(name: str, value: Any, low: int, high: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise ValueError(f"{name} must be {bound}, got {value}")


def shell_join(cmd: Sequence[str]) -> str:
    """The command as one shell-quoted line, for display (dry runs, logs)."""
    return shlex.join(list(cmd))


def _require_absent(launcher: str, plan: LaunchPlan, fields: Iterable[str]) -> None:
    used = [f for f in fields if getattr(plan, f) not in (None, ())]
    if used:
        raise ValueError(f"launcher {launcher!r} does not support {', '.join(used)}")


def _mpi_env(plan: LaunchPlan) -> list[tuple[str, str]]:
    """plan.env plus MASTER_ADDR/MASTER_PORT (rank 0's host) when a port is set."""
    env: dict[str, str] = {}
    if plan.master_port is not None:
        env = {"MASTER_ADDR": plan.hosts[0], "MASTER_PORT": str(plan.master_port)}
    env.update(plan.env)
    return sorted(env.items())


def _pals(plan: LaunchPlan) -> list[str]:
    """PALS mpiexec (Aurora, Polaris); option spellings from the ALCF pages above."""
    cmd = ["mpiexec", "-n", str(plan.world_size), "--ppn", str(plan.ranks_per_node)]
    if plan.hostfile is not None:
        cmd += ["--hostfile", plan.hostfile]
    if plan.cpu_bind is not None:
        cmd.append(f"--cpu-bind={plan.cpu_bind}")
    if plan.depth is not None:
        cmd.append(f"--depth={plan.depth}")
    if plan.gpu_bind is not None:
        cmd.append(f"--gpu-bind={plan.gpu_bind}")
    cmd.append("--envall")
    for key, value in _mpi_env(plan):
        cmd += ["--env", f"{key}={value}"]
    return [*cmd, *plan.wrapper, *plan.argv]


def _mpich(plan: LaunchPlan) -> list[str]:
    """MPICH Hydra with the fork launcher: every rank runs here, hosts are only names."""
    _require_absent("mpich", plan, ("depth", "gpu_bind", "exclude"))
    cmd = ["mpiexec", "-launcher", "fork", "-n", str(plan.world_size)]
    cmd += ["-ppn", str(plan.ranks_per_node), "-hosts", ",".join(plan.hosts)]
    if plan.cpu_bind is not None:
        cmd += ["-bind-to", plan.cpu_bind]
    for key, value in _mpi_env(plan):
        cmd += ["-genv", key, value]
    return [*cmd, *plan.wrapper, *plan.argv]


def _srun(plan: LaunchPlan) -> list[str]:
    """Slurm srun inside an allocation; --export splits on commas, so values may not."""
    env = _mpi_env(plan)
    with_comma = [key for key, value in env if "," in value]
    if with_comma:
        raise ValueError(f"srun --export cannot carry values with commas: {with_comma}")
    cmd = ["srun", f"--nodes={plan.nnodes}", f"--ntasks={plan.world_size}"]
    if plan.taskfile is None:
        cmd += [f"--ntasks-per-node={plan.ranks_per_node}", f"--nodelist={','.join(plan.hosts)}"]
    else:
        # srun sorts --nodelist (srun(1): "the node names will be sorted by Slurm"), so rank 0
        # would not run on hosts[0] (MASTER_ADDR) after a rotation. The arbitrary distribution
        # lays the tasks out "in the order of the file" that SLURM_HOSTFILE names (srun(1)),
        # which is then the node list too: with --nodelist beside it and more than one task a
        # node, Slurm 22.05 fails to create the step ("Unable to create step").
        cmd = ["env", f"SLURM_HOSTFILE={plan.taskfile}", *cmd, "--distribution=arbitrary"]
    if plan.exclude:
        cmd.append(f"--exclude={','.join(plan.exclude)}")
    if plan.depth is not None:
        cmd.append(f"--cpus-per-task={plan.depth}")
    if plan.cpu_bind is not None:
        cmd.append(f"--cpu-bind={plan.cpu_bind}")
    if plan.gpu_bind is not None:
        cmd.append(f"--gpu-bind={plan.gpu_bind}")
    # The supervisor, not srun, ends the launch after a rank fails: srun logs the failed task at
    # once ("srun: error: n2: task 1: Exited with exit code 1"), its peers stay up for a rescue
    # checkpoint (campaign.train.rescue), then the supervisor stops the step. Explicit, as a
    # site's slurm.conf may set KillOnBadExit=1.
    cmd += ["--kill-on-bad-exit=0", ",".join(["--export=ALL", *(f"{k}={v}" for k, v in env)])]
    return [*cmd, *plan.wrapper, *plan.argv]


def _torchrun_target(argv: tuple[str, ...]) -> list[str]:
    """Map ``python -m mod ...`` / ``python script ...`` / ``prog ...`` to torchrun's form."""
    if not _PYTHON.match(argv[0].rsplit("/", 1)[-1]):
        return ["--no-python", *argv]
    if len(argv) >= 3 and argv[1] == "-m":
        return ["-m", *argv[2:]]
    if len(argv) >= 2 and not argv[1].startswith("-"):
        return list(argv[1:])
    raise ValueError(f"torchrun runs 'python -m mod' or 'python script' only: {argv!r}")


def _torchrun(plan: LaunchPlan, node_rank: int | None) -> list[str]:
    """torchrun for one node; a multi-node plan needs one launch per node (node_rank)."""
    _require_absent("torchrun", plan, ("hostfile", "cpu_bind", "depth", "gpu_bind", "wrapper", "taskfile"))
    prefix = ["env", *(f"{k}={v}" for k, v in plan.env)] if plan.env else []
    cmd = [*prefix, "torchrun", "--nnodes", str(plan.nnodes)]
    cmd += ["--nproc_per_node", str(plan.ranks_per_node)]
    if plan.nnodes > 1 or node_rank is not None:
        cmd += _torchrun_static_rdzv(plan, node_rank)
    elif plan.master_port is not None:
        cmd += ["--master_port", str(plan.master_port)]
    else:
        cmd.append("--standalone")
    return [*cmd, *_torchrun_target(plan.argv)]


def _torchrun_static_rdzv(plan: LaunchPlan, node_rank: int | None) -> list[str]:
    # Static rendezvous (master_addr/port + node_rank) keeps rank r on hosts[r // rpn];
    # c10d rendezvous would assign node ranks in arrival order.
    if node_rank is None or plan.master_port is None:
        raise ValueError(
            "torchrun starts one node per launch: a multi-host plan needs node_rank "
            "and master_port (run build_command once per host)"
        )
    _check_int("node_rank", node_rank, 0, plan.nnodes - 1)
    return ["--node_rank", str(node_rank), "--master_addr", plan.hosts[0],
            "--master_port", str(plan.master_port)]


def build_command(launcher: str, plan: LaunchPlan, *, node_rank: int | None = None) -> list[str]:
    """The argv that starts ``plan`` with ``launcher`` (one of :data:`KNOWN_LAUNCHERS`).

    ``node_rank`` is for multi-host ``torchrun`` only, which starts one node per call.
    ``local`` has no single command: use :func:`local_rank_processes`.
    """
    if launcher not in KNOWN_LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}; known: {', '.join(KNOWN_LAUNCHERS)}")
    if launcher == "local":
        raise ValueError("launcher 'local' starts one process per rank: use local_rank_processes()")
    if launcher == "torchrun":
        return _torchrun(plan, node_rank)
    if node_rank is not None:
        raise ValueError(f"node_rank applies to torchrun only, not {launcher!r}")
    builders = {"pals": _pals, "mpich": _mpich, "srun": _srun}
    return builders[launcher](plan)


def local_rank_processes(plan: LaunchPlan) -> list[tuple[list[str], dict[str, str]]]:
    """One (argv, env) per rank, all on this machine; ``hosts`` only name the nodes.

    ``env`` holds what to add to the parent environment: ``plan.env`` overlaid with
    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT
    (``plan.master_port`` or :data:`DEFAULT_MASTER_PORT`) and CAMPAIGN_NODE (the rank's
    host).
    """
    _require_absent("local", plan, ("cpu_bind", "depth", "gpu_bind", "exclude", "taskfile"))
    port = plan.master_port if plan.master_port is not None else DEFAULT_MASTER_PORT
    return [
        ([*plan.wrapper, *plan.argv], _local_env(plan, rank, port))
        for rank in range(plan.world_size)
    ]


def _local_env(plan: LaunchPlan, rank: int, port: int) -> dict[str, str]:
    env = dict(plan.env)
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(plan.world_size),
        LOCAL_RANK=str(rank % plan.ranks_per_node),
        LOCAL_WORLD_SIZE=str(plan.ranks_per_node),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        CAMPAIGN_NODE=plan.host_of(rank),
    )
    return dict(sorted(env.items()))


def render(launcher: str, plan: LaunchPlan, *, node_rank: int | None = None) -> str:
    """Dry-run text: the shell-quoted command, or for ``local`` one ``env ...`` line per rank."""
    if launcher != "local":
        return shell_join(build_command(launcher, plan, node_rank=node_rank))
    lines = [
        shell_join(["env", *(f"{k}={v}" for k, v in env.items()), *argv])
        for argv, env in local_rank_processes(plan)
    ]
    return "\n".join(lines)
