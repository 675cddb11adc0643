"""Tests for executors/launchers.py: golden commands, validation, and real launches.

Golden files live in tests/golden/launch/<case>.txt and hold ``render(...)`` exactly.
Regenerate them after an intended change with::

    CAMPAIGN_UPDATE_GOLDEN=1 pytest tests/unit/test_launchers.py

and review the diff. The MPICH test runs Debian's Hydra ``mpiexec -launcher fork``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from campaign.executors import aurora, polaris  # site presets live with their site
from campaign.supervisor import free_port

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "launch"
UPDATE_ENV = "CAMPAIGN_UPDATE_GOLDEN"


def _load() -> ModuleType:
    """Load the working-tree file itself (stdlib-only module, no package needed)."""
    name = "campaign_launchers_under_test"
    spec = importlib.util.spec_from_file_location(name, ROOT / "executors" / "launchers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve the module by name
    spec.loader.exec_module(module)
    return module


L = _load()
TRAIN = ("python", "-m", "campaign.train", "--config", "/runs/r1/trainer.json")
AURORA_HOSTS = ("x4407c6s2b0n0", "x4407c6s7b0n0")
POLARIS_HOSTS = ("x3001c0s13b0n0", "x3001c0s13b1n0")

CASES: dict[str, tuple[str, Any, dict[str, Any]]] = {
    # the Aurora default: FLAT hierarchy set by us, no --gpu-bind (it fails under FLAT)
    "aurora_pals_2x12": (
        "pals",
        L.LaunchPlan(
            hosts=AURORA_HOSTS,
            ranks_per_node=aurora.RANKS_PER_NODE,
            argv=TRAIN,
            env=(("OMP_NUM_THREADS", "8"), ("ZE_FLAT_DEVICE_HIERARCHY", "FLAT")),
            hostfile="/runs/r1/hostfile",
            cpu_bind=aurora.CPU_BIND,
            master_port=29500,
        ),
        {},
    ),
    # device_hierarchy COMPOSITE: PALS binds one tile per rank
    "aurora_pals_composite_2x12": (
        "pals",
        L.LaunchPlan(
            hosts=AURORA_HOSTS,
            ranks_per_node=aurora.RANKS_PER_NODE,
            argv=TRAIN,
            env=(("OMP_NUM_THREADS", "8"), ("ZE_FLAT_DEVICE_HIERARCHY", "COMPOSITE")),
            hostfile="/runs/r1/hostfile",
            cpu_bind=aurora.CPU_BIND,
            gpu_bind=aurora.GPU_BIND,
            master_port=29500,
        ),
        {},
    ),
    "polaris_pals_2x4": (
        "pals",
        L.LaunchPlan(
            hosts=POLARIS_HOSTS,
            ranks_per_node=polaris.RANKS_PER_NODE,
            argv=TRAIN,
            env=(("OMP_NUM_THREADS", "8"),),
            hostfile="/runs/r1/hostfile",
            cpu_bind=polaris.CPU_BIND,
            depth=polaris.DEPTH,
            master_port=29500,
            wrapper=polaris.GPU_WRAPPER,
        ),
        {},
    ),
    "srun_exclude_2x2": (
        "srun",
        L.LaunchPlan(
            hosts=("n1", "n3"),
            ranks_per_node=2,
            argv=TRAIN,
            env=(("OMP_NUM_THREADS", "1"),),
            exclude=("n2",),
            master_port=29500,
        ),
        {},
    ),
    "srun_rotated_2x2": (  # a confirming retry's rotation: rank 0 on n3, kept by the arbitrary distribution
        "srun",
        L.LaunchPlan(
            hosts=("n3", "n1"),
            ranks_per_node=2,
            argv=TRAIN,
            env=(("OMP_NUM_THREADS", "1"),),
            master_port=29500,
            taskfile="/runs/r1/srun-tasks",
        ),
        {},
    ),
    "mpich_fork_2x2": (
        "mpich",
        L.LaunchPlan(
            hosts=("a", "b"),
            ranks_per_node=2,
            argv=TRAIN,
            env=(("MASTER_ADDR", "127.0.0.1"),),
            master_port=29500,
        ),
        {},
    ),
    "torchrun_1x2": (
        "torchrun",
        L.LaunchPlan(hosts=("localhost",), ranks_per_node=2, argv=TRAIN, master_port=29500),
        {},
    ),
    "local_2x1": (
        "local",
        L.LaunchPlan(
            hosts=("node0", "node1"),
            ranks_per_node=1,
            argv=TRAIN,
            env=(("OMP_NUM_THREADS", "1"),),
            master_port=29511,
        ),
        {},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str) -> None:
    launcher, plan, kwargs = CASES[case]
    text = L.render(launcher, plan, **kwargs) + "\n"
    path = GOLDEN / f"{case}.txt"
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing {path}; create it with {UPDATE_ENV}=1"
    assert text == path.read_text(), f"{case} differs from {path} ({UPDATE_ENV}=1 updates)"


def test_aurora_matches_alcf_docs() -> None:
    """Pin the ALCF-documented binding independently of the golden file."""
    _, plan, _ = CASES["aurora_pals_2x12"]
    cmd = L.build_command("pals", plan)
    assert cmd[:5] == ["mpiexec", "-n", "24", "--ppn", "12"]
    assert (
        "--cpu-bind=list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100"
        in cmd
    )
    assert "ZE_FLAT_DEVICE_HIERARCHY=FLAT" in cmd and not any(c.startswith("--gpu-bind") for c in cmd)
    composite = L.build_command("pals", CASES["aurora_pals_composite_2x12"][1])
    assert "--gpu-bind=list:0.0:0.1:1.0:1.1:2.0:2.1:3.0:3.1:4.0:4.1:5.0:5.1" in composite
    assert cmd[-len(TRAIN):] == list(TRAIN)
    ranges = aurora.CPU_BIND.removeprefix("list:").split(":")
    cores = {c for r in ranges for c in range(int(r.split("-")[0]), int(r.split("-")[1]) + 1)}
    assert len(ranges) == 12 and 0 not in cores and 52 not in cores


def test_polaris_matches_alcf_docs() -> None:
    _, plan, _ = CASES["polaris_pals_2x4"]
    cmd = L.build_command("pals", plan)
    assert cmd[:5] == ["mpiexec", "-n", "8", "--ppn", "4"]
    assert "--depth=8" in cmd and "--cpu-bind=depth" in cmd


@pytest.mark.parametrize("local_rank,gpu", [(0, "3"), (1, "2"), (2, "1"), (3, "0"), (5, "2")])
def test_polaris_gpu_wrapper_sets_cuda_visible_devices(local_rank: int, gpu: str) -> None:
    if shutil.which("bash") is None:
        pytest.skip("bash not available")
    probe = [sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"]
    env = {**os.environ, "PMI_LOCAL_RANK": str(local_rank)}
    out = subprocess.run([*polaris.GPU_WRAPPER, *probe], env=env, capture_output=True,
                         text=True, check=True, timeout=30)
    assert out.stdout.strip() == gpu


def test_world_size_and_rank_placement() -> None:
    plan = L.LaunchPlan(hosts=("a", "b", "c"), ranks_per_node=4, argv=("x",))
    assert plan.world_size == 12 and plan.nnodes == 3
    assert [plan.host_of(r) for r in (0, 3, 4, 11)] == ["a", "a", "b", "c"]


def test_env_is_normalised_sorted() -> None:
    plan = L.LaunchPlan(hosts=["a"], ranks_per_node=1, argv=["x"], env=[("B", "2"), ("A", "1")])
    assert plan.env == (("A", "1"), ("B", "2"))
    from_map = L.LaunchPlan(hosts=("a",), ranks_per_node=1, argv=("x",), env={"B": "2", "A": "1"})
    assert from_map == plan
    assert plan.hosts == ("a",) and plan.argv == ("x",)
    assert hash(plan) == hash(L.LaunchPlan(hosts=("a",), ranks_per_node=1, argv=("x",),
                                           env=(("A", "1"), ("B", "2"))))


def test_plan_env_overrides_derived_master_addr() -> None:
    plan = L.LaunchPlan(hosts=("a", "b"), ranks_per_node=1, argv=("x",), master_port=1234,
                        env=(("MASTER_ADDR", "127.0.0.1"),))
    cmd = L.build_command("pals", plan)
    assert "MASTER_ADDR=127.0.0.1" in cmd and "MASTER_PORT=1234" in cmd
    assert "MASTER_ADDR=a" not in cmd


def test_torchrun_forms() -> None:
    one = dict(hosts=("h",), ranks_per_node=2)
    script = L.build_command("torchrun", L.LaunchPlan(argv=("python3", "t.py", "-v"), **one))
    assert script == ["torchrun", "--nnodes", "1", "--nproc_per_node", "2", "--standalone",
                      "t.py", "-v"]
    binary = L.build_command("torchrun", L.LaunchPlan(argv=("./a.out",), env={"K": "v"}, **one))
    assert binary[:3] == ["env", "K=v", "torchrun"] and binary[-2:] == ["--no-python", "./a.out"]
    with pytest.raises(ValueError, match="python -m mod"):
        L.build_command("torchrun", L.LaunchPlan(argv=("python", "-u", "t.py"), **one))


def test_torchrun_multi_node_one_launch_per_node() -> None:
    plan = L.LaunchPlan(hosts=("h0", "h1"), ranks_per_node=4, argv=TRAIN, master_port=29500)
    with pytest.raises(ValueError, match="one node per launch"):
        L.build_command("torchrun", plan)
    cmd = L.build_command("torchrun", plan, node_rank=1)
    assert cmd == ["torchrun", "--nnodes", "2", "--nproc_per_node", "4", "--node_rank", "1",
                   "--master_addr", "h0", "--master_port", "29500", "-m", "campaign.train",
                   "--config", "/runs/r1/trainer.json"]
    with pytest.raises(ValueError, match="node_rank"):
        L.build_command("torchrun", plan, node_rank=2)


def test_local_rank_processes_env() -> None:
    _, plan, _ = CASES["local_2x1"]
    procs = L.local_rank_processes(plan)
    assert [argv for argv, _ in procs] == [list(TRAIN)] * 2
    assert procs[1][1] == {
        "CAMPAIGN_NODE": "node1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511", "OMP_NUM_THREADS": "1",
        "RANK": "1", "WORLD_SIZE": "2",
    }
    default = L.LaunchPlan(hosts=("a",), ranks_per_node=1, argv=("x",))
    assert L.local_rank_processes(default)[0][1]["MASTER_PORT"] == str(L.DEFAULT_MASTER_PORT)


def test_local_processes_really_run() -> None:
    keys = "('RANK', 'LOCAL_RANK', 'CAMPAIGN_NODE')"
    probe = f"import os, json; print(json.dumps({{k: os.environ[k] for k in {keys}}}))"
    plan = L.LaunchPlan(hosts=("a", "b"), ranks_per_node=2, argv=(sys.executable, "-c", probe))
    seen = []
    for argv, env in L.local_rank_processes(plan):
        out = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True,
                             check=True, timeout=60)
        seen.append(json.loads(out.stdout))
    assert seen == [{"RANK": str(r), "LOCAL_RANK": str(r % 2), "CAMPAIGN_NODE": "ab"[r // 2]}
                    for r in range(4)]


MPI_PROBE = """
import json, os, sys
keys = ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
        "MPIR_CVAR_CH3_INTERFACE_HOSTNAME", "CAMPAIGN_PROBE")
row = {k: os.environ.get(k) for k in keys}
with open(os.path.join(sys.argv[1], "rank%s.json" % row["PMI_RANK"]), "w") as f:
    json.dump(row, f)
"""


def _hydra_mpiexec() -> str | None:
    path = shutil.which("mpiexec")
    if path is None:
        return None
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    return path if "HYDRA" in out.stdout else None


def test_mpich_fork_really_runs(tmp_path: Path) -> None:
    """Hydra sets PMI_RANK/PMI_SIZE/MPI_LOCALRANKID; a rank sees its assigned host in
    MPIR_CVAR_CH3_INTERFACE_HOSTNAME (gethostname() is this machine under fork)."""
    if _hydra_mpiexec() is None:
        pytest.skip("MPICH Hydra mpiexec not installed (apt-get install mpich)")
    script = tmp_path / "probe.py"
    script.write_text(MPI_PROBE)
    outdir = tmp_path / "out"
    outdir.mkdir()
    plan = L.LaunchPlan(hosts=("a", "b"), ranks_per_node=2,
                        argv=(sys.executable, str(script), str(outdir)),
                        env=(("CAMPAIGN_PROBE", "x,y z"),))
    subprocess.run(L.build_command("mpich", plan), capture_output=True, text=True,
                   check=True, timeout=120)
    rows = [json.loads((outdir / f"rank{r}.json").read_text()) for r in range(4)]
    assert len(list(outdir.iterdir())) == 4
    assert [row["PMI_RANK"] for row in rows] == ["0", "1", "2", "3"]
    assert {row["PMI_SIZE"] for row in rows} == {"4"}
    assert [row["MPI_LOCALRANKID"] for row in rows] == ["0", "1", "0", "1"]
    assert {row["MPI_LOCALNRANKS"] for row in rows} == {"2"}
    assert [row["MPIR_CVAR_CH3_INTERFACE_HOSTNAME"] for row in rows] == ["a", "a", "b", "b"]
    assert {row["CAMPAIGN_PROBE"] for row in rows} == {"x,y z"}


@pytest.mark.slow
def test_torchrun_really_runs(tmp_path: Path) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun not installed next to this interpreter")
    pkg = tmp_path / "probepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    # One write per rank (print may write the line and its newline apart): two ranks sharing
    # torchrun's stdout interleaved into "RR 0 0" once, on a loaded machine.
    (pkg / "hello.py").write_text(
        "import os\nos.write(1, f\"R {os.environ['RANK']} {os.environ['LOCAL_RANK']}\\n\".encode())\n")
    # A free port (a fixed one failed once late in a CI run: exit 0, no rank output), and
    # an environment without another launcher's rank variables or torchrun's PET_* options.
    plan = L.LaunchPlan(hosts=("localhost",), ranks_per_node=2,
                        argv=("python", "-m", "probepkg.hello"), master_port=free_port())
    cmd = L.build_command("torchrun", plan)
    cmd[0] = str(torchrun)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "MASTER_", "PMI_", "SLURM_"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")}
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**env, "PYTHONPATH": str(tmp_path)})
    # torchrun may prefix worker lines ("[default0]:R 0 0") when it tees their output.
    ranks = sorted(m.group(1) for m in re.finditer(r"^(?:\[\w+\]:)?(R \d+ \d+)$", out.stdout, re.M))
    assert out.returncode == 0 and ranks == ["R 0 0", "R 1 1"], (
        f"{shlex.join(cmd)}\nexit {out.returncode}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr[-4000:]}")


def _plan(**overrides: Any) -> Any:
    fields: dict[str, Any] = dict(hosts=("a", "b"), ranks_per_node=2, argv=("x",))
    fields.update(overrides)
    return L.LaunchPlan(**fields)


@pytest.mark.parametrize("overrides,match", [
    ({"ranks_per_node": 0}, "ranks_per_node must be >= 1"),
    ({"ranks_per_node": True}, "ranks_per_node must be an int"),
    ({"hosts": ()}, "hosts must not be empty"),
    ({"hosts": ("a", "b", "a")}, r"duplicate hosts: \['a'\]"),
    ({"hosts": "ab"}, "not one string"),
    ({"hosts": ("a,b",)}, "invalid host names"),
    ({"argv": ()}, "argv must not be empty"),
    ({"exclude": ("b",)}, "also excluded"),
    ({"env": (("1BAD", "x"),)}, "invalid environment variable name"),
    ({"env": (("A", "1"), ("A", "2"))}, "duplicate environment variables"),
    ({"env": (("A", 1),)}, r"\(str, str\) pairs"),
    ({"depth": 0}, "depth must be >= 1"),
    ({"master_port": 70000}, "master_port must be in 1..65535"),
])
def test_invalid_plans(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _plan(**overrides)


def test_unknown_launcher_names_known_ones() -> None:
    with pytest.raises(ValueError, match="known: local, mpich, pals, srun, torchrun"):
        L.build_command("aprun", _plan())


@pytest.mark.parametrize("launcher,overrides,match", [
    ("local", {}, "use local_rank_processes"),
    ("mpich", {"gpu_bind": "list:0"}, "'mpich' does not support gpu_bind"),
    ("mpich", {"exclude": ("z",)}, "does not support exclude"),
    ("torchrun", {"hosts": ("a",), "cpu_bind": "depth"}, "does not support cpu_bind"),
    ("srun", {"env": (("A", "x,y"),)}, "commas"),
])
def test_unsupported_combinations(launcher: str, overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        L.build_command(launcher, _plan(**overrides))


def test_node_rank_only_for_torchrun() -> None:
    with pytest.raises(ValueError, match="torchrun only"):
        L.build_command("pals", _plan(), node_rank=0)


def test_local_rejects_binding() -> None:
    with pytest.raises(ValueError, match="'local' does not support cpu_bind"):
        L.local_rank_processes(_plan(cpu_bind="depth"))


def test_shell_join_quotes() -> None:
    assert L.shell_join(["echo", "a b", "$X"]) == "echo 'a b' '$X'"
