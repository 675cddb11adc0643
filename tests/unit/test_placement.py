"""campaign/train/placement.py: the launchers' real rank variables and the device each rank
must take. Every row names where its variables come from."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from campaign.executors import aurora, polaris
from campaign.executors.base import LaunchOptions
from campaign.executors.aurora import AuroraSite
from campaign.executors.polaris import PolarisSite
from campaign.train.placement import (
    PlacementError,
    first_node_placement,
    launch_placement,
    placement,
    polaris_wrapper_env,
)

REPO = Path(__file__).resolve().parents[2]

# Aurora, PALS mpiexec: rank 13 of 2 nodes x 12, local rank 1. Variables as ALCF's
# gpu_tile_compact.sh and affinity scripts read them
# (https://docs.alcf.anl.gov/aurora/running-jobs-aurora/): PALS_RANKID, PALS_LOCAL_RANKID,
# PMI_RANK, PMI_LOCAL_RANK; PMI_SIZE/PMI_LOCAL_SIZE as Cray PMI sets them (NCAR mpibind's gpu_bind).
PALS = {"PALS_RANKID": "13", "PALS_LOCAL_RANKID": "1", "PALS_NODEID": "1", "PMI_RANK": "13", "PMI_SIZE": "24",
        "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "12"}
# Polaris: the same PALS variables, 2 nodes x 4 (https://docs.alcf.anl.gov/polaris/running-jobs/using-gpus/).
PALS_POLARIS = {"PALS_RANKID": "5", "PALS_LOCAL_RANKID": "1", "PMI_RANK": "5", "PMI_SIZE": "8",
                "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "4"}
# srun, 2 nodes x 4 tasks, task 6 = node 1 local 2: srun(1) OUTPUT ENVIRONMENT VARIABLES
# (https://slurm.schedmd.com/srun.html).
SRUN = {"SLURM_PROCID": "6", "SLURM_LOCALID": "2", "SLURM_NODEID": "1", "SLURM_NTASKS": "8",
        "SLURM_NPROCS": "8", "SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
        "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0"}

ROWS = [
    # (id, env, runtime device count, device type, (source, rank, local, world, local world, device, visible))
    # Aurora default: ZE_FLAT_DEVICE_HIERARCHY=FLAT (12 tiles = 12 devices), no --gpu-bind
    # (ALCF: --gpu-bind fails under FLAT; the frameworks module sets FLAT).
    ("pals-flat-no-bind", {**PALS, "ZE_FLAT_DEVICE_HIERARCHY": "FLAT"}, 12, "xpu",
     ("pals", 13, 1, 24, 12, "xpu:1", 12)),
    ("pals-flat-count-unknown", {**PALS, "ZE_FLAT_DEVICE_HIERARCHY": "FLAT"}, None, "xpu",
     ("pals", 13, 1, 24, 12, "xpu:1", None)),
    # COMPOSITE + --gpu-bind=list:0.0:0.1:...: PALS sets ZE_AFFINITY_MASK=0.1 for local rank 1
    # and the rank sees one device (ALCF's --gpu-bind example: "RT_GPU_ID 0 - GPU_ID 0.1").
    ("pals-composite-gpu-bind", {**PALS, "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE", "ZE_AFFINITY_MASK": "0.1"}, 1,
     "xpu", ("pals", 13, 1, 24, 12, "xpu:0", 1)),
    ("pals-composite-gpu-bind-env-only", {**PALS, "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE", "ZE_AFFINITY_MASK": "0.1"},
     None, "xpu", ("pals", 13, 1, 24, 12, "xpu:0", 1)),
    # COMPOSITE + gpu_tile_compact.sh (ALCF): ZE_AFFINITY_MASK=$gpu.$tile, ZE_ENABLE_PCI_ID_DEVICE_ORDER=1.
    ("pals-composite-tile-compact", {**PALS, "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE", "ZE_AFFINITY_MASK": "0.1",
                                     "ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1"}, None, "xpu",
     ("pals", 13, 1, 24, 12, "xpu:0", 1)),
    # COMPOSITE, 6 ranks/node, gpu_dev_compact.sh style whole-GPU masks (implicit scaling, ALCF Example 2).
    ("pals-composite-dev-compact", {**PALS, "PALS_RANKID": "7", "PMI_RANK": "7", "PMI_LOCAL_SIZE": "6",
                                    "PMI_SIZE": "12", "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE", "ZE_AFFINITY_MASK": "1"},
     None, "xpu", ("pals", 7, 1, 12, 6, "xpu:0", 1)),
    # COMPOSITE, 6 ranks/node, no mask: 6 GPUs for 6 ranks.
    ("pals-composite-6-ranks-no-mask", {**PALS, "PALS_RANKID": "7", "PMI_RANK": "7", "PMI_LOCAL_SIZE": "6",
                                        "PMI_SIZE": "12", "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}, 6, "xpu",
     ("pals", 7, 1, 12, 6, "xpu:1", 6)),
    # FLAT, 24 ranks/node sharing 12 tiles evenly (several CCSs per tile; ALCF "Running with Multiple CCSs").
    ("pals-flat-two-ranks-per-tile", {**PALS, "PALS_LOCAL_RANKID": "13", "PMI_LOCAL_RANK": "13",
                                      "PMI_LOCAL_SIZE": "24", "PMI_SIZE": "48", "PALS_RANKID": "13", "PMI_RANK": "13",
                                      "ZE_FLAT_DEVICE_HIERARCHY": "FLAT"}, 12, "xpu",
     ("pals", 13, 13, 48, 24, "xpu:1", 12)),
    # Polaris: set_affinity_gpu_polaris.sh leaves CUDA_VISIBLE_DEVICES=3 - local % 4 = 2: ONE GPU,
    # which is cuda:0 (set_device(local_rank=1) crashed here).
    ("polaris-wrapper", {**PALS_POLARIS, "CUDA_VISIBLE_DEVICES": "2"}, 1, "cuda",
     ("pals", 5, 1, 8, 4, "cuda:0", 1)),
    ("polaris-wrapper-env-only", {**PALS_POLARIS, "CUDA_VISIBLE_DEVICES": "2"}, None, "cuda",
     ("pals", 5, 1, 8, 4, "cuda:0", 1)),
    ("polaris-no-wrapper", PALS_POLARIS, 4, "cuda", ("pals", 5, 1, 8, 4, "cuda:1", 4)),
    # srun --mpi=pmi2: Slurm's pmi2 plugin (src/plugins/mpi/pmi2/mpi_pmi2.c) adds PMI_FD,
    # PMI_JOBID, PMI_RANK, PMI_SIZE and no local rank: SLURM_LOCALID must win.
    ("srun-pmi2", {**SRUN, "PMI_RANK": "6", "PMI_SIZE": "8", "PMI_FD": "7", "PMI_JOBID": "42.0"}, 4, "cuda",
     ("slurm-pmi2", 6, 2, 8, 4, "cuda:2", 4)),
    # srun --mpi=pmix: the PMIx plugin exports PMIX_RANK and PMIX_NAMESPACE.
    ("srun-pmix", {**SRUN, "PMIX_RANK": "6", "PMIX_NAMESPACE": "slurm.pmix.42.0"}, 4, "cuda",
     ("slurm-pmix", 6, 2, 8, 4, "cuda:2", 4)),
    ("srun-none", SRUN, 4, "cuda", ("slurm", 6, 2, 8, 4, "cuda:2", 4)),
    # srun --gpus-per-task=1 (or --gpu-bind=single:1): each task's CUDA_VISIBLE_DEVICES names one GPU.
    ("srun-gpus-per-task", {**SRUN, "CUDA_VISIBLE_DEVICES": "2"}, 1, "cuda", ("slurm", 6, 2, 8, 4, "cuda:0", 1)),
    # srun --ntasks-per-node given: SLURM_NTASKS_PER_NODE; uneven per-node counts `4,3` by SLURM_NODEID.
    ("srun-ntasks-per-node", {k: v for k, v in SRUN.items() if "TASKS_PER_NODE" not in k}
     | {"SLURM_NTASKS_PER_NODE": "4"}, None, "cpu", ("slurm", 6, 2, 8, 4, "cpu", None)),
    ("srun-uneven", {**SRUN, "SLURM_NTASKS": "7", "SLURM_STEP_NUM_TASKS": "7", "SLURM_STEP_TASKS_PER_NODE": "4,3"},
     None, "cpu", ("slurm", 6, 2, 7, 3, "cpu", None)),
    # torchrun (https://docs.pytorch.org/docs/stable/elastic/run.html): RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE.
    ("torchrun", {"RANK": "9", "LOCAL_RANK": "1", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1"},
     8, "cuda", ("torchrun", 9, 1, 16, 8, "cuda:1", 8)),
    # torchrun inside an srun step: torchrun's own variables win.
    ("torchrun-under-srun", {**SRUN, "RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"},
     4, "cuda", ("torchrun", 3, 3, 8, 4, "cuda:3", 4)),
    # MPICH Hydra (checked with Debian's mpiexec.hydra -launcher fork, tests/unit/test_launchers.py).
    ("mpich-hydra", {"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4",
                     "PMI_FD": "6", "MPIR_CVAR_CH3_INTERFACE_HOSTNAME": "b"}, None, "cpu",
     ("mpich", 5, 1, 8, 4, "cpu", None)),
    # Hydra bootstrapped by srun inside a Slurm job: SLURM_PROCID is the proxy's (the node's), not the rank.
    ("mpich-hydra-under-slurm", {**SRUN, "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "PMI_RANK": "5", "PMI_SIZE": "8",
                                 "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"}, 4, "cuda",
     ("mpich", 5, 1, 8, 4, "cuda:1", 4)),
    # Open MPI mpirun(1), "Exported Environment Variables".
    ("openmpi", {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                 "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_RANK": "3"}, 2, "cuda", ("openmpi", 3, 1, 4, 2, "cuda:1", 2)),
    # This package's `local` launcher (executors/launchers.local_rank_processes) with bind_gpus:
    # each virtual node sees its R GPUs.
    ("local-bind-gpus", {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                         "CUDA_VISIBLE_DEVICES": "2,3"}, 2, "cuda", ("torchrun", 3, 1, 4, 2, "cuda:1", 2)),
    # The form the old reader accepted: PMI_RANK/PMI_SIZE with PALS_LOCAL_RANKID.
    ("pals-pmi-only", {"PMI_RANK": "13", "PMI_SIZE": "24", "PALS_LOCAL_RANKID": "1", "PALS_LOCAL_SIZE": "12"},
     None, "cpu", ("pals", 13, 1, 24, 12, "cpu", None)),
    ("single-process-pmi", {"PMI_RANK": "0", "PMI_SIZE": "1"}, 1, "cuda", ("pmi", 0, 0, 1, 1, "cuda:0", 1)),
    ("nothing", {}, None, "cpu", ("single", 0, 0, 1, 1, "cpu", None)),
]


@pytest.mark.parametrize("env, count, dtype, want", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_placement_follows_each_launchers_convention(env, count, dtype, want) -> None:
    p = placement(env, count, dtype)
    assert (p.source, p.rank, p.local_rank, p.world_size, p.local_world_size, p.device, p.visible) == want


ERRORS = [
    # srun --mpi=pmi2 outside Slurm's variables (or a PMI launcher without a local rank): every rank
    # would take GPU 0.
    ("pmi-without-local-rank", {"PMI_RANK": "6", "PMI_SIZE": "8"}, 4, "cuda", "no variable gives the local rank"),
    ("pmix-alone", {"PMIX_RANK": "3"}, None, "cpu", "PMIX_RANK is set"),
    ("cuda-none-visible", {**SRUN, "CUDA_VISIBLE_DEVICES": ""}, None, "cuda", "no cuda device is visible"),
    ("cuda-runtime-zero", SRUN, 0, "cuda", "no cuda device is visible"),
    # 4 ranks, 2 GPUs: NCCL refuses two ranks of a communicator on one GPU ("Duplicate GPU detected").
    ("cuda-oversubscribed", {**SRUN, "CUDA_VISIBLE_DEVICES": "0,1"}, 2, "cuda", "NCCL refuses"),
    # COMPOSITE, 12 ranks/node, no binding: 6 whole GPUs for 12 ranks.
    ("composite-12-ranks-no-bind", {**PALS, "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}, 6, "xpu",
     "ZE_FLAT_DEVICE_HIERARCHY=FLAT"),
    ("xpu-uneven", {**PALS, "ZE_FLAT_DEVICE_HIERARCHY": "FLAT", "ZE_AFFINITY_MASK": "0,1,2,3,4"}, None, "xpu",
     "cannot share the devices evenly"),
    ("bad-number", {"RANK": "x", "WORLD_SIZE": "2"}, None, "cpu", "not a whole number"),
    ("inconsistent", {"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, None, "cpu",
     "inconsistent"),
]


@pytest.mark.parametrize("env, count, dtype, match", [r[1:] for r in ERRORS], ids=[r[0] for r in ERRORS])
def test_placement_refuses_what_is_surely_wrong(env, count, dtype, match) -> None:
    with pytest.raises(PlacementError, match=match):
        placement(env, count, dtype)


def test_composite_mask_counts_gpus_not_tiles() -> None:
    env = {**PALS, "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE", "ZE_AFFINITY_MASK": "0.0,0.1"}
    assert placement(env, None, "xpu").visible == 1  # one GPU, two tiles: device 0
    flat = {**PALS, "ZE_FLAT_DEVICE_HIERARCHY": "FLAT", "ZE_AFFINITY_MASK": "0,1"}
    assert placement(flat, None, "xpu").device == "xpu:1"


def test_placement_module_is_standard_library_only() -> None:
    tree = ast.parse((REPO / "campaign" / "train" / "placement.py").read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names <= set(sys.stdlib_module_names), names - set(sys.stdlib_module_names)


# ---- the first node of a launch (the dry run) ------------------------------------------------------


def test_aurora_default_is_flat_one_tile_per_local_rank() -> None:
    site = AuroraSite(account="p")
    rows = launch_placement(site.launch_options(), site.ranks_per_node, "xpu", node_devices=12,
                            rank_env=site.rank_variables, nodes=2)
    assert [r["device"] for r in rows] == [f"xpu:{i}" for i in range(12)]
    assert rows[0] == {"local_rank": 0, "cpus": "1-8", "visible_devices": "all", "rank": 0, "world_size": 24,
                       "local_world_size": 12, "rank_source": "pals-pmix", "device": "xpu:0"}
    assert rows[6]["cpus"] == "53-60" and all("error" not in r for r in rows)


def test_aurora_composite_with_gpu_bind_gives_each_rank_one_tile() -> None:
    rows = first_node_placement(12, aurora.CPU_BIND, aurora.GPU_BIND, None, flat=False,
                                device_type="xpu", node_devices=6)
    assert [r["visible_devices"] for r in rows[:3]] == ["0.0", "0.1", "1.0"]
    assert {r["device"] for r in rows} == {"xpu:0"}


def test_gpu_bind_under_flat_is_an_error_row() -> None:
    rows = first_node_placement(12, None, aurora.GPU_BIND, None, flat=True, device_type="xpu")
    assert all(r["device"] is None and "--gpu-bind fails" in r["error"] for r in rows)


def test_composite_without_binding_is_an_error_row() -> None:
    rows = first_node_placement(12, aurora.CPU_BIND, None, None, flat=False, device_type="xpu",
                                node_devices=6)
    assert rows[0]["device"] is None and "COMPOSITE" in rows[0]["error"]


def test_polaris_wrapper_leaves_one_gpu_per_rank() -> None:
    site = PolarisSite(account="p")
    rows = launch_placement(site.launch_options(), site.ranks_per_node, "cuda", node_devices=4)
    assert [r["visible_devices"] for r in rows] == ["3", "2", "1", "0"]
    assert [r["device"] for r in rows] == ["cuda:0"] * 4
    assert [r["cpus"] for r in rows] == ["0-7", "8-15", "16-23", "24-31"]
    bare = launch_placement(PolarisSite(account="p", gpu_affinity=False).launch_options(), 4, "cuda", 4)
    assert [r["device"] for r in bare] == [f"cuda:{i}" for i in range(4)]


def test_unknown_wrapper_is_refused() -> None:
    with pytest.raises(PlacementError, match="unknown wrapper"):
        launch_placement(LaunchOptions(wrapper=("numactl", "-l")), 4, "cuda")


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not available")
def test_polaris_wrapper_env_matches_the_real_wrapper() -> None:
    probe = [sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"]
    for local in range(8):
        out = subprocess.run([*polaris.GPU_WRAPPER, *probe], capture_output=True, text=True, check=True,
                             env={**os.environ, "PMI_LOCAL_RANK": str(local)}, timeout=30).stdout.strip()
        assert polaris_wrapper_env(local) == {"CUDA_VISIBLE_DEVICES": out}


@pytest.mark.parametrize("site, match", [
    ("  gpu_bind: list:0.0:0.1:1.0:1.1:2.0:2.1:3.0:3.1:4.0:4.1:5.0:5.1\n", "--gpu-bind fails"),
    ("  device_hierarchy: COMPOSITE\n", "COMPOSITE"),
    ("  env: {ZE_FLAT_DEVICE_HIERARCHY: COMPOSITE}\n", "contradicts"),
])
def test_aurora_site_refuses_placements_that_cannot_work(site: str, match: str) -> None:
    from campaign import spec
    from campaign.errors import SpecError

    with pytest.raises(SpecError, match=match) as err:
        spec.loads(f"name: d\nsite:\n  kind: aurora\n  account: p\n{site}stages:\n  - kind: smoke\n", "d.yaml")
    assert "site.gpu_bind" in str(err.value) or "site.env" in str(err.value)
    ok = "  device_hierarchy: COMPOSITE\n  gpu_bind: list:0.0:0.1:1.0:1.1:2.0:2.1:3.0:3.1:4.0:4.1:5.0:5.1\n"
    spec.loads(f"name: d\nsite:\n  kind: aurora\n  account: p\n{ok}stages:\n  - kind: smoke\n", "d.yaml")


# ---- Aurora: PALS in PMIx mode -----------------------------------------------------------------------
# What a rank of Aurora's `mpiexec` has, built from quoted facts (docs/sites.md, "Rank variables
# on Aurora"), not from this package's code. No published `env` dump of an Aurora rank was found
# (searched ALCF's user guides, ezpz, ALCF's example repositories), so the environment is the
# variables ALCF's own scripts read, and no size variable:
#   PMIX_RANK          the `frameworks` binding script: `gpu_id=$((PMIX_RANK % ${num_gpus} ))`
#   PALS_LOCAL_RANKID  gpu_tile_compact.sh and the PyTorch DDP example (`LOCAL_RANK = os.environ.get('PALS_LOCAL_RANKID')`)
#   PALS_APID          HPE's PALS documentation ("Unique application identifier")
#   PMIX_NAMESPACE     PMIx's own (every PMIx client has one)
# The job's size is `NNODES=`wc -l < $PBS_NODEFILE`` x ranks per node in ALCF's job templates.
AURORA_HOSTS = ["x4102c5s2b0n0", "x4102c5s3b0n0"]


def aurora_rank_env(rank: int, per_node: int, hostfile: Path, *, pals_rankid: bool = False) -> dict[str, str]:
    env = {"PMIX_RANK": str(rank), "PALS_LOCAL_RANKID": str(rank % per_node), "PALS_APID": "7d2c1d0e-1",
           "PMIX_NAMESPACE": "pals.5120431", "PBS_NODEFILE": "/var/spool/pbs/aux/5120431.aurora-pbs-0001",
           "CAMPAIGN_HOSTFILE": str(hostfile), "CAMPAIGN_RANKS_PER_NODE": str(per_node),
           "ZE_FLAT_DEVICE_HIERARCHY": "FLAT"}
    if pals_rankid:
        env["PALS_RANKID"] = str(rank)
    return env


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("pals_rankid", [False, True], ids=["pmix-rank", "pals-rankid"])
def test_every_aurora_rank_computes_its_rank_and_the_world_from_pmix_and_the_hostfile(
        tmp_path: Path, nodes: int, pals_rankid: bool) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{h}\n" for h in AURORA_HOSTS[:nodes]))
    for rank in range(12 * nodes):
        p = placement(aurora_rank_env(rank, 12, hostfile, pals_rankid=pals_rankid), 12, "xpu")
        assert (p.rank, p.world_size, p.local_rank, p.local_world_size, p.device) == (
            rank, 12 * nodes, rank % 12, 12, f"xpu:{rank % 12}"), rank
        assert p.source == "pals-pmix"


def test_an_aurora_rank_without_a_hostfile_or_ranks_per_node_says_what_is_missing(tmp_path: Path) -> None:
    env = {k: v for k, v in aurora_rank_env(3, 12, tmp_path / "hostfile").items()
           if k not in ("CAMPAIGN_HOSTFILE", "PBS_NODEFILE", "CAMPAIGN_RANKS_PER_NODE")}
    with pytest.raises(PlacementError, match="no world size.*CAMPAIGN_RANKS_PER_NODE.*CAMPAIGN_HOSTFILE or PBS_NODEFILE"):
        placement(env, 12, "xpu")
    with pytest.raises(PlacementError, match="cannot read the hostfile"):
        placement(aurora_rank_env(3, 12, tmp_path / "missing"), 12, "xpu")


def test_pbs_nodefile_sizes_the_world_when_the_launch_names_no_hostfile(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("".join(f"{h}\n" for h in AURORA_HOSTS))
    env = {k: v for k, v in aurora_rank_env(13, 12, tmp_path / "unused").items() if k != "CAMPAIGN_HOSTFILE"}
    p = placement({**env, "PBS_NODEFILE": str(nodefile)}, 12, "xpu")
    assert (p.rank, p.world_size, p.local_rank) == (13, 24, 1)


def test_the_launch_tells_every_rank_its_ranks_per_node(tmp_path: Path) -> None:
    from campaign import spec
    from campaign.dryrun import _request

    s = spec.loads("name: d\nsite: {kind: aurora, account: p}\nstages:\n  - kind: smoke\n", "d.yaml")
    request = _request(s, s.stages[0], 2, tmp_path / "smoke", 1, tmp_path)
    assert request.env["CAMPAIGN_RANKS_PER_NODE"] == "12"
    assert request.env["CAMPAIGN_HOSTFILE"] == str(request.hostfile)
