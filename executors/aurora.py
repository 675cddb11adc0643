"""The `aurora` site: ALCF Aurora, PBS Pro blocks, PALS `mpiexec`, 12 ranks per node.

Fields a user changes (in the campaign file, under `site:`):
    account        your ALCF project (qsub -A)
    queue          `debug` (default: 1-2 nodes, 1 h), `debug-scaling` (2-256, 1 h), `prod` (256 nodes
                   and up, routes by size: small <= 1024 / 12 h, medium <= 1999 / 18 h, large / 24 h),
                   `capacity` (1-16 nodes, 7 days); the block (nodes + spares, walltime) is checked
                   against executors/queues.py
    walltime       of one block, HH:MM:SS
    nodes, spares  active nodes a stage may use, and extra nodes that replace excluded ones
    worker_init    activates your environment, e.g. `module load frameworks; source ~/venv/bin/activate`
    collective_env ALCF's recommended oneCCL variables on every rank (default true; `env` overrides one)
    copper         start ALCF's Copper cache and import Python through it (default auto: from 1000 nodes)
    tmpdir         TMPDIR of the job's Parsl worker (default /tmp: AF_UNIX paths stay short)
    address_interface  interface of the driver's host that workers connect to (default: hsn0
                   where the driver's host has it, else every address Parsl finds)

A block is `qsub -l select=N:ncpus=208 -l filesystems=home:flare -l place=scatter`, as
ALCF recommends (https://docs.alcf.anl.gov/aurora/running-jobs-aurora/, and Parsl on
Aurora: https://docs.alcf.anl.gov/aurora/workflows/parsl/). One Parsl worker runs on the
head node; the trainer is started with PALS `mpiexec --hostfile` over the active nodes,
12 ranks per node, `--cpu-bind=list:...` leaving cores 0 and 52 to the OS, and one GPU tile
per rank: by default `ZE_FLAT_DEVICE_HIERARCHY=FLAT` is set on every rank (12 tiles seen as
12 devices; rank i takes xpu:i) with no `--gpu-bind`, which fails under FLAT (ALCF, "Binding
MPI ranks to GPUs"). `device_hierarchy: COMPOSITE` with `gpu_bind: list:0.0:0.1:...` binds
tiles through PALS instead (each rank sees one device, xpu:0). Every rank also gets
`ZE_ENABLE_PCI_ID_DEVICE_ORDER=1` (devices in PCI order, as ALCF's binding script sets) and
oneCCL's minimal set and tuning block (`collective_env`). `qsub` runs in the campaign's Parsl
run directory (under --workdir), and the job works there (`cd $PBS_O_WORKDIR`). See
docs/launchers.md and, for every fact and its source, docs/sites.md.

`launcher: mpich` is a STAND-IN for tests on one machine (the PBS emulator in tests/infra):
MPICH `mpiexec -launcher fork` starts every rank locally under the node names of
`PBS_NODEFILE`; the CPU/GPU binding is dropped and `MASTER_ADDR` is 127.0.0.1.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from campaign.executors import pbs
from campaign.executors.base import LaunchOptions

# https://docs.alcf.anl.gov/aurora/running-jobs-aurora/ ("MPI rank and thread binding to cores
# and GPUs", running-jobs-aurora.md @ 512a0056, 2026-07-27; these lines since 94904579, 2025-04-21):
# "Since March 31, 2025, cores 0 (104) and 52 (156)--the first
# physical cores on each CPU socket--have been reserved for system services". ALCF's lists
# give each socket's next 48 cores (1-48, 53-100) to its half of the ranks: 12 ranks x 8
# cores ("--cpu-bind=list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100")
# and 6 ranks x 16 ("--cpu-bind=list:1-16:17-32:33-48:53-68:69-84:85-100"). `cpu_bind_list`
# follows that rule for any even split.
RANKS_PER_NODE = 12
SOCKET_FIRST_CORES = (1, 53)
"""The first core each socket leaves to applications (0 and 52 are the system's)."""
CORES_PER_SOCKET = 48
"""Cores per socket ALCF's lists hand out (1-48, 53-100)."""


def cpu_bind_list(ranks_per_node: int) -> str | None:
    """ALCF's `--cpu-bind=list:...` for `ranks_per_node` ranks: half the ranks per socket, each
    an equal run of that socket's 48 cores; None when they do not split evenly."""
    per_socket, odd = divmod(ranks_per_node, 2)
    if odd or per_socket == 0 or CORES_PER_SOCKET % per_socket:
        return None
    width = CORES_PER_SOCKET // per_socket
    return "list:" + ":".join(f"{first + i * width}-{first + (i + 1) * width - 1}"
                              for first in SOCKET_FIRST_CORES for i in range(per_socket))


CPU_BIND = cpu_bind_list(RANKS_PER_NODE)
# Same page, "Binding MPI ranks to GPUs using --gpu-bind": one rank per tile, for
# ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE only. The page warns it fails for implicit (whole-GPU)
# lists and with ZE_FLAT_DEVICE_HIERARCHY=FLAT ("launch failed ...: Failed to parse implicit
# GPU selection"), the mode the `frameworks` module sets and "preferred for AI/ML frameworks",
# and recommends no binding script with that module.
GPU_BIND = "list:0.0:0.1:1.0:1.1:2.0:2.1:3.0:3.1:4.0:4.1:5.0:5.1"
# The Aurora default: FLAT, set by us on every rank (so it does not depend on the modules
# loaded), 12 tiles seen as 12 devices, no --gpu-bind; the trainer takes xpu:<local rank>
# (campaign/train/placement.py). Intel: https://www.intel.com/content/www/us/en/developer/articles/technical/flattening-gpu-tile-hierarchy.html
TILES_PER_NODE = 12
"""Devices a node shows under FLAT."""
# https://docs.alcf.anl.gov/aurora/data-management/lustre/flare/ (flare.md @ 14bd245f, 2025-01-28):
# Flare, "mounted at `/lus/flare/projects/`": "You should launch jobs only from this Flare space."
# https://docs.alcf.anl.gov/aurora/running-jobs-aurora/ (@ 512a0056, 2026-07-27): "Jobs should be
# submitted only from your allocated project directory and not from your home directory".
PROJECTS = "/lus/flare/projects"
# ALCF's oneCCL page, "oneCCL environment variables" (https://docs.alcf.anl.gov/aurora/data-science/frameworks/oneCCL/,
# argonne-lcf/user-guides docs/aurora/data-science/frameworks/oneCCL.md @ f2eb40a6, 2026-03-17; the
# minimal set since 8ba3fa7a, 2026-03-06): "a set of environment settings that typically provide
# better performance or address potential application hangs and crashes at large scale. This
# particular setup is still **experimental**". Its "Minimal set", "essential for functionality for
# training workloads" (CCL_PROCESS_LAUNCHER=pmix, CCL_ATL_TRANSPORT=mpi, FI_MR_CACHE_MONITOR=userfaultfd,
# CCL_KVS_MODE=mpi), then its tuning block as listed there. Left out: the page's
# "application-dependent" block (FI_MR_CACHE_MONITOR=disabled, FI_CXI_* sizes, PALS_* timeouts,
# CCL_ATL_SYNC_COLL, ...): add what your runs need in `env`. Quotes: docs/sites.md.
COLLECTIVE_ENV: tuple[tuple[str, str], ...] = (
    ("CCL_PROCESS_LAUNCHER", "pmix"),
    ("CCL_ATL_TRANSPORT", "mpi"),
    ("FI_MR_CACHE_MONITOR", "userfaultfd"),
    ("CCL_KVS_MODE", "mpi"),
    # "currently best allreduce algorithm at large scale"
    ("CCL_ALLREDUCE_SCALEOUT", "direct:0-1048576;rabenseifner:1048577-max"),
    ("CCL_BCAST", "double_tree"),
    ("CCL_CONFIGURATION", "cpu_gpu_dpcpp"),
    ("CCL_KVS_CONNECTION_TIMEOUT", "600"),
    ("CCL_ZE_CACHE_OPEN_IPC_HANDLES_THRESHOLD", "1024"),
    ("CCL_KVS_USE_MPI_RANKS", "1"),
)
# The same block's lines that the page runs in the job's shell: `export CCL_CONFIGURATION_PATH=""`
# (an empty value, exported there rather than passed as an empty `--env`), and the lines that
# need what `module load frameworks` set (FI_PROVIDER, the MPICH tuning files), so they run
# after worker_init.
COLLECTIVE_JOB_LINES: tuple[str, ...] = (
    'export CCL_CONFIGURATION_PATH=""',
    'if [ -n "${FI_PROVIDER:-}" ]; then export MPI_PROVIDER="$FI_PROVIDER"; fi',
    "unset MPIR_CVAR_CH4_POSIX_COLL_SELECTION_TUNING_JSON_FILE MPIR_CVAR_CH4_COLL_SELECTION_TUNING_JSON_FILE "
    "MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE",
)
# https://docs.alcf.anl.gov/aurora/running-jobs-aurora/ (docs/aurora/running-jobs-aurora.md @ 512a0056,
# 2026-07-27), ALCF's `gpu_tile_compact.sh`: "export ZE_ENABLE_PCI_ID_DEVICE_ORDER=1" before
# ZE_AFFINITY_MASK. Devices are then numbered in PCI order, the order the page's tile-to-socket
# table (ranks 0-5 on socket 0's GPUs 0-2) and our --cpu-bind lists assume: set on every rank.
DEVICE_ORDER_ENV: tuple[tuple[str, str], ...] = (("ZE_ENABLE_PCI_ID_DEVICE_ORDER", "1"),)
# Copper (https://docs.alcf.anl.gov/aurora/data-management/copper/copper/, copper.md @ 9677c044,
# 2026-06-19): `module load copper`, `launch_copper.sh [-d log_dir_base] [-v CU_FUSE_MNT_VIEWDIR]`,
# then the ranks' imports through the mount: "--genvall
# --genv=PYTHONPATH=/tmp/${USER}/copper/${CUSTOM_VENV_PATH}/lib64/python3.10/site-packages:$PYTHONPATH".
# ALCF's Python page (python.md @ 5f3e18d3, 2026-03-13; the sentence since d83569d4): "beyond 1000 nodes, importing Python
# modules from a home or Lustre project directory might be significantly slower, or it may even
# crash the Lustre file system".
COPPER_FROM_NODES = 1000
"""`copper: auto` starts Copper from this many active nodes (ALCF's Python page)."""
COPPER_MOUNT = "/tmp/${USER}/copper"
"""Where Copper shows the filesystem (`-v`; launch_copper.sh's own default, and the page's path)."""
COPPER_LOGS = "${PBS_O_WORKDIR}/copper-logs"
"""Copper's log folder (`-d`): the job's submit directory, the campaign's (launch_copper.sh's default is ~)."""
COPPER_SERVICE_CORES = (48, 49, 50, 51)
"""The page: "Keep Copper service cores out of the application CPU binding list. On Aurora,
common service cores are `48,49,50,51`" (launch_copper.sh's default `-b`)."""
RESERVED_CORES = (0, 52)
PHYSICAL_CORES = 104
GPUS_PER_NODE = 6
"""Devices a node shows under COMPOSITE (two tiles each)."""


class AuroraSite(pbs.PBSSite):
    """ALCF Aurora: PBS Pro blocks, PALS mpiexec, one rank per GPU tile."""

    CPUS_PER_NODE: ClassVar[int] = 208
    """Logical CPUs of an Aurora node (2 x 52 cores x 2 hyperthreads): PBS `ncpus`."""
    DRY_RUN_JOB_ID: ClassVar[str] = "DRYRUN.aurora-pbs-0001.hostmgmt.cm.aurora.alcf.anl.gov"
    COLLECTIVE_ENV: ClassVar[tuple[tuple[str, str], ...]] = COLLECTIVE_ENV
    COLLECTIVE_JOB_LINES: ClassVar[tuple[str, ...]] = COLLECTIVE_JOB_LINES
    PREFERRED_INTERFACE: ClassVar[str | None] = "hsn0"
    """Workers reach the driver over the Slingshot interface when its host has one (docs/sites.md)."""
    COMPUTE_NODES_ONLINE: ClassVar[bool] = False
    """Aurora's compute nodes reach the internet only through ALCF's proxy: W&B logs offline by default."""

    kind: Literal["aurora"] = "aurora"
    """Site kind."""
    filesystems: str = "home:flare"
    """Filesystems the job needs (-l filesystems=); add daos_user for DAOS."""
    ranks_per_node: int = Field(default=RANKS_PER_NODE, ge=1, le=208)
    """Ranks per node (12: one per GPU tile)."""
    cpu_bind: str | None = "auto"
    """PALS --cpu-bind value. `auto`: ALCF's list for `ranks_per_node` (12 ranks: 8 cores each,
    6 ranks: 16 each; cores 0 and 52 left to the OS); null: no binding; or your own `list:...`."""
    device_hierarchy: Literal["FLAT", "COMPOSITE"] = "FLAT"
    """ZE_FLAT_DEVICE_HIERARCHY set on every rank: FLAT (12 tiles = 12 devices, rank i takes
    xpu:i) or COMPOSITE (6 GPUs of 2 tiles; needs gpu_bind for 12 ranks per node)."""
    gpu_bind: str | None = None
    """PALS --gpu-bind value, COMPOSITE only (e.g. `list:0.0:0.1:1.0:...:5.1`, rank i on tile i//2.i%2)."""
    copper: bool | Literal["auto"] = "auto"
    """Start ALCF's Copper cache in the job and import the ranks' Python packages through it
    (`PYTHONPATH` through its mount, docs/sites.md). `auto`: from 1000 active nodes, where ALCF
    warns that imports from Lustre may be "significantly slower, or it may even crash the Lustre
    file system"; off below."""

    @property
    def copper_on(self) -> bool:
        """Whether the job starts Copper (`copper`, `auto` resolved by the active node count)."""
        return self.nodes >= COPPER_FROM_NODES if self.copper == "auto" else self.copper


    @model_validator(mode="after")
    def _cpu_bind_for_the_ranks(self) -> AuroraSite:
        if self.cpu_bind == "auto":
            resolved = cpu_bind_list(self.ranks_per_node)
            if resolved is None and self.launcher == "pals":
                raise ValueError(f"site.cpu_bind: ALCF's CPU lists split each socket's 48 cores (1-48, 53-100) "
                                 f"between half the ranks; {self.ranks_per_node} ranks per node do not split so: "
                                 "give your own (list:a-b:c-d:...), or null for no binding")
            object.__setattr__(self, "cpu_bind", resolved)
        return self

    @model_validator(mode="after")
    def _devices_can_be_placed(self) -> AuroraSite:
        if self.launcher == "mpich" or "ZE_FLAT_DEVICE_HIERARCHY" in self.env:
            if self.env.get("ZE_FLAT_DEVICE_HIERARCHY", self.device_hierarchy) != self.device_hierarchy:
                raise ValueError("site.env: ZE_FLAT_DEVICE_HIERARCHY contradicts site.device_hierarchy; "
                                 "set device_hierarchy only")
            if self.launcher == "mpich":
                return self
        from campaign.train.placement import first_node_placement

        rows = first_node_placement(self.ranks_per_node, self.cpu_bind, self.gpu_bind, self.env,
                                    flat=self.device_hierarchy == "FLAT", device_type="xpu",
                                    node_devices=TILES_PER_NODE if self.device_hierarchy == "FLAT" else GPUS_PER_NODE,
                                    rank_env=self.rank_variables, nodes=self.nodes)
        bad = next((r for r in rows if r.get("error")), None)
        if bad:
            raise ValueError(f"site.gpu_bind: local rank {bad['local_rank']} cannot be placed "
                             f"(device_hierarchy {self.device_hierarchy}): {bad['error']}")
        return self

    @model_validator(mode="after")
    def _copper_has_cores(self) -> AuroraSite:
        if self.copper_on and self.launcher == "pals" and copper_cores(self.cpu_bind) == ():
            raise ValueError(f"site.copper: Copper needs service cores outside the ranks' binding (ALCF: "
                             f"\"Keep Copper service cores out of the application CPU binding list\"), and "
                             f"cpu_bind {self.cpu_bind} leaves none of cores 1-51, 53-103 free: narrow cpu_bind, "
                             "or set copper: false")
        return self

    def job_environment(self) -> list[str]:
        """ALCF's oneCCL shell lines (`collective_env`), then Copper's (`copper`)."""
        return super().job_environment() + (copper_job_lines(self.cpu_bind) if self.copper_on and self.launcher == "pals"
                                            else [])

    def settings_warnings(self) -> list[str]:
        """Copper off on 1000 nodes or more while the Python environment is on Lustre (ALCF
        "highly" recommends Copper there): the file alone tells it, so `validate` prints it."""
        where = python_on_lustre(self.worker_init)
        if self.copper_on or self.nodes < COPPER_FROM_NODES or where is None:
            return []
        return [f"site.copper: off for {self.nodes} nodes while Python imports from {where} (Lustre); "
                f"ALCF: beyond {COPPER_FROM_NODES} nodes such imports \"might be significantly slower, or it "
                "may even crash the Lustre file system\": set copper: auto or true "
                "(docs.alcf.anl.gov/aurora/data-science/python/)"]

    def preflight_warnings(self) -> list[str]:
        """`settings_warnings()`, and a driver's host without hsn0, the interface ALCF's Parsl
        page has the workers connect to."""
        warnings = self.settings_warnings()
        if self.launcher == "pals" and not (self.address or self.address_interface):
            from campaign.executors.batch import preferred_address

            if preferred_address(self) is None:
                warnings.append("site.address_interface: this host has no hsn0, the interface ALCF's Parsl page has "
                                "workers connect over (address_by_interface('hsn0')); workers will be offered every "
                                "address of this host: submit from an Aurora login node, or set site.address")
        return warnings

    def workdir_warnings(self, workdir: Path, *, remote: bool) -> list[str]:
        """Runs belong on Flare (/lus/flare/projects/ACCOUNT), not in home (Gecko)."""
        if remote and workdir.is_absolute() and _under(workdir, Path(PROJECTS)):
            return []
        if not remote and not _under(workdir.resolve(), Path.home()):
            return []
        where = ("it is under your home directory (Gecko)" if not remote else
                 "on the endpoint it resolves under $HOME (Gecko)" if not workdir.is_absolute() else f"not under {PROJECTS}")
        return [f"--workdir {workdir}: {where}; ALCF says to launch jobs only from Flare: "
                f"--workdir {PROJECTS}/{self.account}/campaigns (docs.alcf.anl.gov/aurora/data-management/lustre/flare/)"]

    def remote_workdir(self) -> Path | None:
        """Flare, the project's directory: ALCF says to launch jobs from there, not from home."""
        return Path(PROJECTS) / self.account / "campaigns"

    @property
    def rank_variables(self) -> str:
        """PALS in PMIx mode on the machine (no size variable, campaign.train.placement)."""
        return "pals-pmix" if self.launcher == "pals" else "mpich"

    def devices(self) -> tuple[str, int | None]:
        return "xpu", TILES_PER_NODE if self.device_hierarchy == "FLAT" else GPUS_PER_NODE

    def launch_options(self) -> LaunchOptions:
        """CPU and GPU binding, and extra environment."""
        if self.launcher == "mpich":  # every rank runs here: no binding, loopback rendezvous
            return LaunchOptions(env={"MASTER_ADDR": "127.0.0.1", **self.env})
        env = self.rank_env({"ZE_FLAT_DEVICE_HIERARCHY": self.device_hierarchy, **dict(DEVICE_ORDER_ENV)})
        return LaunchOptions(env=env, cpu_bind=self.cpu_bind, gpu_bind=self.gpu_bind)


def bound_cores(cpu_bind: str) -> set[int]:
    """The physical cores a `list:a-b:c,d:...` binding uses (logical CPU i and i + 104 share core i)."""
    cores: set[int] = set()
    for part in re.split(r"[:,]", cpu_bind.removeprefix("list:")):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (hi.isdigit() or not hi):
            cores.update(c % PHYSICAL_CORES for c in range(int(lo), int(hi or lo) + 1))
    return cores


def copper_cores(cpu_bind: str | None) -> tuple[int, ...] | None:
    """Copper's service cores (`launch_copper.sh -b`) for a binding: None where ALCF's default
    48-51 is free of it (no `-b`); else the first four physical cores the binding and the
    system (0, 52) leave free (49,50,51,101 for ALCF's 12-rank list, whose rank 5 holds 41-48);
    () when none is free."""
    if cpu_bind is None or not cpu_bind.startswith("list:"):
        return None
    used = bound_cores(cpu_bind) | set(RESERVED_CORES)
    if not used & set(COPPER_SERVICE_CORES):
        return None
    return tuple(c for c in range(PHYSICAL_CORES) if c not in used)[:4]


def copper_job_lines(cpu_bind: str | None) -> list[str]:
    """The job's lines that start Copper as ALCF's page does and point the ranks' imports
    through it: the interpreter's site-packages (the venv `worker_init` activated) prepended
    to PYTHONPATH under the mount; every rank inherits it (`mpiexec --envall`, the page's
    `--genvall`). Copper stops when the job script exits. If it does not start, the ranks
    import from Lustre as before (one line on the job's stderr)."""
    cores = copper_cores(cpu_bind)
    where = f'-d "{COPPER_LOGS}" -v "{COPPER_MOUNT}"'
    site_packages = "$(python3 -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))')"
    return [
        "module load copper",
        f"if launch_copper.sh {where}{' -b ' + ','.join(map(str, cores)) if cores else ''}; then",
        f'  export PYTHONPATH="{COPPER_MOUNT}{site_packages}${{PYTHONPATH:+:$PYTHONPATH}}"',
        f"  trap 'stop_copper.sh {where}' EXIT",
        "else",
        '  echo "campaign: Copper did not start; the ranks import Python from Lustre" >&2',
        "fi",
    ]


_ACTIVATE = re.compile(r"(?:\bsource|(?:^|[;&|\s])\.)\s+(\S+)/bin/activate\b|\bconda\s+activate\s+(\S+)")


def python_on_lustre(worker_init: str) -> str | None:
    """The Python environment the job activates (`source X/bin/activate`, `conda activate X`;
    else this interpreter's, which the job puts on PATH) when it lies on Lustre: under /lus/ or
    a home directory (Gecko, ALCF's "home or Lustre project directory"); None otherwise."""
    found = [a or b for a, b in _ACTIVATE.findall(worker_init)]
    prefix = found[-1] if found else sys.prefix
    if prefix.startswith(("~", "$HOME", "${HOME}", "/home/", "/lus/")):
        return prefix
    return None


def _under(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents
