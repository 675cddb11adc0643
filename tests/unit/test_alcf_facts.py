"""Aurora facts, each checked against the facility's own words (issue 38).

Every test holds a quote from ALCF's user guides, verbatim, with the page's URL and the
argonne-lcf/user-guides commit that holds the text (docs/sites.md lists the same), and checks
what the `aurora` site renders (the job script's lines run in bash, the PALS launch line, the
ranks' environment, validation) against the quote, not against the site's own constants.

What these tests fake, and where: nothing of Aurora runs here. The job's shell lines run in
this machine's bash; `module`, `launch_copper.sh`/`stop_copper.sh` and `qsub` are stand-ins
that record how they were called (the boundary: those commands' argv and working directory).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from campaign import dryrun, spec
from campaign.errors import SpecError
from campaign.executors import aurora, pbs
from campaign.executors.aurora import AuroraSite

needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="bash not available")

# https://docs.alcf.anl.gov/aurora/data-science/frameworks/oneCCL/ "oneCCL environment variables",
# argonne-lcf/user-guides docs/aurora/data-science/frameworks/oneCCL.md @ f2eb40a6 (2026-03-17);
# the minimal set since 8ba3fa7a (2026-03-06). "Among them, there is a minimal list, which are
# essential for functionality for training workloads, and we have tested up to 1024 nodes."
ONECCL_MINIMAL = """\
export CCL_PROCESS_LAUNCHER=pmix
export CCL_ATL_TRANSPORT=mpi
export FI_MR_CACHE_MONITOR=userfaultfd
export CCL_KVS_MODE=mpi
"""
# Same page: "Beyond that an application should tune based on the list below."
ONECCL_TUNING = """\
export CCL_PROCESS_LAUNCHER=pmix  
export CCL_ATL_TRANSPORT=mpi
export CCL_ALLREDUCE_SCALEOUT="direct:0-1048576;rabenseifner:1048577-max"  # currently best allreduce algorithm at large scale
export CCL_BCAST=double_tree # currently best bcast algorithm at large scale

export CCL_KVS_MODE=mpi
export CCL_CONFIGURATION_PATH=""
export CCL_CONFIGURATION=cpu_gpu_dpcpp
export CCL_KVS_CONNECTION_TIMEOUT=600 

export CCL_ZE_CACHE_OPEN_IPC_HANDLES_THRESHOLD=1024
export CCL_KVS_USE_MPI_RANKS=1

export MPI_PROVIDER=$FI_PROVIDER
unset MPIR_CVAR_CH4_POSIX_COLL_SELECTION_TUNING_JSON_FILE
unset MPIR_CVAR_CH4_COLL_SELECTION_TUNING_JSON_FILE
unset MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE
"""
# https://docs.alcf.anl.gov/aurora/running-jobs-aurora/, docs/aurora/running-jobs-aurora.md @ 512a0056
# (2026-07-27): "A simple version of `gpu_tile_compact.sh` script is below to illustrate how
# `ZE_AFFINITY_MASK` is uniquely set for each MPI rank."
GPU_TILE_COMPACT = """\
#!/bin/bash -l
num_gpu=6
num_tile=2
gpu_id=$(( (PALS_LOCAL_RANKID / num_tile ) % num_gpu ))
tile_id=$((PALS_LOCAL_RANKID % num_tile))
export ZE_ENABLE_PCI_ID_DEVICE_ORDER=1
export ZE_AFFINITY_MASK=$gpu_id.$tile_id
#echo "RANK= ${PMI_RANK} LOCAL_RANK= ${PMI_LOCAL_RANK} gpu= ${gpu}"
exec "$@"
"""
# https://docs.alcf.anl.gov/aurora/data-science/frameworks/pytorch/, docs/aurora/data-science/frameworks/pytorch.md
# @ 212407ef (2026-03-17), "Major changes in the frameworks module of Spring 2026 (`frameworks/2025.3.1`)":
PYTORCH_BACKEND = "When initializing `torch.distributed`, the `backend` must be changed to `xccl` from `ccl`."
# https://docs.alcf.anl.gov/aurora/running-jobs-aurora/ @ 512a0056, "Submitting a job" (since 2918c834, 2024-10-28):
SUBMIT_FROM = ("Jobs should be submitted only from your allocated project directory and not from your home "
               "directory or from `/soft/modulefiles`.")
# https://docs.alcf.anl.gov/aurora/workflows/parsl/, docs/aurora/workflows/parsl.md @ dc465358 (2026-07-16):
PARSL_ADDRESS = """\
			# Ensures connections are made over the slingshot network
			address=address_by_interface('hsn0'),
"""
# https://docs.alcf.anl.gov/aurora/data-science/python/, docs/aurora/data-science/python.md @ 5f3e18d3
# (2026-03-13; the sentence since d83569d4, 2025-01-09):
PYTHON_AT_SCALE = ("We have seen that beyond 1000 nodes, importing Python modules from a home or Lustre project "
                   "directory might be significantly slower, or it may even crash the Lustre file system.")
# https://docs.alcf.anl.gov/aurora/data-management/copper/copper/, docs/aurora/data-management/copper/copper.md
# @ 9677c044 (2026-06-19), "Python virtual environment":
COPPER_VENV = """\
CUSTOM_VENV_PATH=/lus/flare/projects/${PROJECT_NAME}/${USER}/myenv
source ${CUSTOM_VENV_PATH}/bin/activate

module load copper
launch_copper.sh

time mpirun --np ${NRANKS} --ppn ${RANKS_PER_NODE} \\
  --cpu-bind=list:4:56:9:61:14:66:19:71:20:74:25:79 --genvall \\
  --genv=PYTHONPATH=/tmp/${USER}/copper/${CUSTOM_VENV_PATH}/lib64/python3.10/site-packages:$PYTHONPATH \\
  python3 -c "import dragon; print(dragon.__file__)"

stop_copper.sh
"""
# Same page, "Starting and Stopping Copper" and "Best practices" 10:
COPPER_USAGE = """\
launch_copper.sh [-d log_dir_base] [-v CU_FUSE_MNT_VIEWDIR]
stop_copper.sh   [-d log_dir_base] [-v CU_FUSE_MNT_VIEWDIR]
"""
COPPER_CORES = ("Keep Copper service cores out of the application CPU binding list. On Aurora, common service "
                "cores are `48,49,50,51`.")
# https://docs.alcf.anl.gov/aurora/running-jobs-aurora/ @ 512a0056, "Binding MPI ranks to GPUs" (since 94904579):
ALCF_12_RANKS = "--cpu-bind=list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100"


def _bash_env(script: str, env: dict[str, str], cwd: Path | None = None) -> dict[str, str]:
    """The environment after `script` ran in bash from `env` (what the job's worker, and through
    `mpiexec --envall` every rank, inherits)."""
    out = subprocess.run(["bash", "-c", script + "\nenv -0"], env=env, cwd=cwd, capture_output=True, check=True,
                         timeout=60)
    return dict(line.split("=", 1) for line in out.stdout.decode().split("\0") if "=" in line)


def _launch_line(site_yaml: str, tmp_path: Path) -> str:
    s = spec.loads(f"name: f\nsite: {site_yaml}\nstages:\n  - kind: smoke\n", "f.yaml")
    return dryrun.launch_text(s, s.stages[0], 1, tmp_path / "smoke")


def _rank_env(site: AuroraSite, start: dict[str, str]) -> dict[str, str]:
    """A rank's environment: the job's shell after worker_init and the site's lines, then the
    launch line's `--env` values on top (they win)."""
    job = _bash_env(site.provider().worker_init, start)
    return {**job, **site.launch_options().env}


@needs_bash
def test_every_rank_gets_the_oneccl_pages_minimal_set_and_tuning_block(tmp_path: Path) -> None:
    tuning = ("MPIR_CVAR_CH4_POSIX_COLL_SELECTION_TUNING_JSON_FILE", "MPIR_CVAR_CH4_COLL_SELECTION_TUNING_JSON_FILE",
              "MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE")
    start = {"PATH": os.environ["PATH"], **{k: "/opt/tuning.json" for k in tuning}}
    # what the page's lines leave in a shell where `module load frameworks` set FI_PROVIDER
    page = _bash_env("export FI_PROVIDER=cxi\n" + ONECCL_MINIMAL + ONECCL_TUNING, start)
    ours = _rank_env(AuroraSite(account="p", worker_init="export FI_PROVIDER=cxi"), start)
    set_by_page = {k for k in page if k not in start or page[k] != start[k]} - {"FI_PROVIDER", "_", "SHLVL", "PWD"}
    assert {"FI_MR_CACHE_MONITOR", "CCL_CONFIGURATION_PATH", "MPI_PROVIDER"} <= set_by_page
    assert {k: ours.get(k) for k in set_by_page} == {k: page[k] for k in set_by_page}
    assert not any(k in ours for k in tuning) and not any(k in page for k in tuning)
    # CCL_CONFIGURATION_PATH="" is exported in the job's shell, as the page does, not an empty --env
    line = _launch_line("{kind: aurora, account: p}", tmp_path)
    assert "CCL_CONFIGURATION_PATH" not in line and "--env FI_MR_CACHE_MONITOR=userfaultfd" in line
    # the user's env still wins over one of them (e.g. the page's application-dependent "disabled")
    mine = AuroraSite(account="p", env={"FI_MR_CACHE_MONITOR": "disabled"}).launch_options().env
    assert mine["FI_MR_CACHE_MONITOR"] == "disabled"


@needs_bash
def test_ranks_number_their_tiles_in_pci_order_as_alcfs_binding_script_does() -> None:
    env = AuroraSite(account="p").launch_options().env
    for local in range(12):
        script = _bash_env(GPU_TILE_COMPACT.replace('exec "$@"', ""),
                           {"PATH": os.environ["PATH"], "PALS_LOCAL_RANKID": str(local)})
        assert env["ZE_ENABLE_PCI_ID_DEVICE_ORDER"] == script["ZE_ENABLE_PCI_ID_DEVICE_ORDER"]
        # under FLAT, ALCF's tile gpu.tile is device 2 * gpu + tile, the one our rank takes (xpu:local)
        gpu, tile = map(int, script["ZE_AFFINITY_MASK"].split("."))
        from campaign.train.placement import launch_placement

        rows = launch_placement(AuroraSite(account="p").launch_options(), 12, "xpu", 12, rank_env="pals-pmix")
        assert rows[local]["device"] == f"xpu:{2 * gpu + tile}"
    assert AuroraSite(account="p", launcher="mpich").launch_options().env.get("ZE_ENABLE_PCI_ID_DEVICE_ORDER") is None


def test_backend_ccl_is_refused_at_validate_with_the_pages_fix() -> None:
    new, old = re.search(r"changed to `(\w+)` from `(\w+)`", PYTORCH_BACKEND).groups()  # type: ignore[union-attr]
    with pytest.raises(SpecError) as e:
        spec.loads(f"name: b\nsite: {{kind: aurora, account: p}}\ntrainer:\n  backend: {old}\nstages:\n  - kind: smoke\n",
                   "b.yaml")
    assert f"trainer.backend: '{old}'" in str(e.value) and f"set backend: {new}" in str(e.value)
    assert "b.yaml, line 4" in str(e.value)
    spec.loads(f"name: b\nsite: {{kind: aurora, account: p}}\ntrainer:\n  backend: {new}\nstages:\n  - kind: smoke\n", "b.yaml")


def _fake_command(folder: Path, name: str, body: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("#!/bin/sh\n" + body)
    (folder / name).chmod(0o755)


def test_blocks_are_submitted_from_the_campaigns_folder_not_the_callers(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    assert "not from your home directory" in SUBMIT_FROM
    bindir, home, record = tmp_path / "bin", tmp_path / "home", tmp_path / "qsub-ran-in"
    _fake_command(bindir, "qsub", f'pwd > {record}\necho 1.aurora-pbs-0001\n')  # stand-in for PBS Pro's qsub
    home.mkdir()
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.chdir(home)  # `campaign submit` typed in $HOME
    run_dir = tmp_path / "wd" / "c" / "parsl"
    provider = AuroraSite(account="p").parsl_config(run_dir).executors[0].provider
    provider.script_dir = str(run_dir / "000" / "submit_scripts")
    Path(provider.script_dir).mkdir(parents=True)
    assert provider.submit("true", 1, "parsl.campaign.block-0") == "1.aurora-pbs-0001"  # Parsl's own submit()
    assert record.read_text().strip() == str(run_dir)
    assert list(home.iterdir()) == []
    # the job, started by PBS in $HOME, works in the folder it was submitted from (PBS_O_WORKDIR)
    script = next(Path(provider.script_dir).glob("parsl.campaign.block-0.*[0-9]"))
    assert pbs.CD_SUBMIT_DIR in script.read_text()
    job = _bash_env(pbs.CD_SUBMIT_DIR, {"PATH": os.environ["PATH"], "PBS_O_WORKDIR": str(run_dir)}, cwd=home)
    assert job["PWD"] == str(run_dir)
    # and --dry-run prints where qsub runs
    _, commands = AuroraSite(account="p").dry_run(run_dir / "000" / "submit_scripts")
    assert commands[0].startswith(f"cd {run_dir} && qsub ")


def test_workers_connect_over_the_interface_alcfs_parsl_page_names() -> None:
    named = re.search(r"address_by_interface\('(\w+)'\)", PARSL_ADDRESS).group(1)  # type: ignore[union-attr]
    assert AuroraSite.PREFERRED_INTERFACE == named
    site = AuroraSite(account="p")
    if not any(named in line for line in Path("/proc/net/dev").read_text().splitlines()[2:]):
        assert any(w.startswith("site.address_interface: this host has no hsn0") for w in site.preflight_warnings())
    assert not any("hsn0" in w for w in AuroraSite(account="p", address="10.0.0.1").preflight_warnings())


def test_copper_is_on_from_the_node_count_alcfs_python_page_names_and_warned_when_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    threshold = int(re.search(r"beyond (\d+) nodes", PYTHON_AT_SCALE).group(1))  # type: ignore[union-attr]
    venv = "module load frameworks; source /lus/flare/projects/p/venv/bin/activate"
    below = AuroraSite(account="p", queue="prod", nodes=threshold - 1, walltime="06:00:00", worker_init=venv)
    at = AuroraSite(account="p", queue="prod", nodes=threshold, walltime="06:00:00", worker_init=venv)
    assert not below.copper_on and "launch_copper.sh" not in below.provider().worker_init
    assert at.copper_on and "launch_copper.sh" in at.provider().worker_init
    off = at.model_copy(update={"copper": False})
    (warning,) = [w for w in off.preflight_warnings() if w.startswith("site.copper")]
    assert "/lus/flare/projects/p/venv" in warning and "set copper: auto or true" in warning
    assert "significantly slower, or it may even crash the Lustre file system" in PYTHON_AT_SCALE
    assert "may even crash the Lustre file system" in warning
    # not on Lustre (the frameworks module's Python only): no warning
    monkeypatch.setattr(aurora.sys, "prefix", "/opt/aurora/26.26.0/frameworks/aurora_frameworks-2025.3.1")
    plain = AuroraSite(account="p", queue="prod", nodes=threshold, walltime="06:00:00", copper=False,
                       worker_init="module load frameworks")
    assert not any(w.startswith("site.copper") for w in plain.preflight_warnings())


def test_copper_service_cores_stay_out_of_the_ranks_binding() -> None:
    cores = tuple(int(c) for c in re.search(r"`([\d,]+)`", COPPER_CORES).group(1).split(","))  # type: ignore[union-attr]
    assert cores == aurora.COPPER_SERVICE_CORES  # the page's default, launch_copper.sh's own `-b`
    bound = aurora.bound_cores(ALCF_12_RANKS.removeprefix("--cpu-bind="))
    assert bound & set(cores) == {48}  # ALCF's 12-rank list gives core 48 to rank 5
    chosen = aurora.copper_cores(ALCF_12_RANKS.removeprefix("--cpu-bind="))
    assert chosen and len(chosen) == 4 and not set(chosen) & (bound | {0, 52})
    # a binding that leaves 48-51 alone keeps Copper's default (no -b)
    assert aurora.copper_cores("list:1-8:9-16:17-24:53-60:61-68:69-76") is None
    with pytest.raises(SpecError, match="site.copper: Copper needs service cores"):
        spec.loads("name: c\nsite: {kind: aurora, account: p, copper: true, ranks_per_node: 2, "
                   "cpu_bind: 'list:1-51:53-103'}\nstages:\n  - kind: smoke\n", "c.yaml")


@needs_bash
def test_copper_starts_in_the_job_and_the_ranks_import_through_it_as_the_page_shows(tmp_path: Path) -> None:
    venv = tmp_path / "lus" / "myenv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    calls = tmp_path / "calls"
    bindir = tmp_path / "copper-bin"  # stand-ins for the copper module's scripts: they record their argv
    for name in ("launch_copper.sh", "stop_copper.sh"):
        _fake_command(bindir, name, f'echo "{name} $*" >> {calls}\n')
    module = f'module() {{ echo "module $*" >> {calls}; export PATH={bindir}:$PATH; }}\n'
    site = AuroraSite(account="p", copper=True, worker_init=f"source {venv}/bin/activate")
    script = site.provider().worker_init
    start = {"PATH": os.environ["PATH"], "USER": "alice", "PBS_O_WORKDIR": str(tmp_path / "wd"),
             "PYTHONPATH": "/opt/app"}
    (tmp_path / "wd").mkdir()
    job = _bash_env(module + script, start)
    # the page, run with the same venv: its --genv value (its python3.10 is the example's version)
    page_line = re.search(r"--genv=PYTHONPATH=(\S+)", COPPER_VENV).group(1)  # type: ignore[union-attr]
    page = _bash_env(f'CUSTOM_VENV_PATH={venv}\nexport X="{page_line}"', start)["X"]
    ours_first, ours_rest = job["PYTHONPATH"].split(":", 1)
    page_first, page_rest = page.split(":", 1)
    assert ours_rest == page_rest == "/opt/app"
    mount = "/tmp/alice/copper"
    assert ours_first.startswith(mount + "/") and page_first.startswith(mount + "/")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    page_path = Path(page_first.removeprefix(mount).replace("//", "/").replace("python3.10", version))
    assert Path(ours_first.removeprefix(mount)).resolve() == page_path.resolve()  # lib64 is the venv's link to lib
    # `module load copper`, then launch_copper.sh with the page's -d/-v options (and -b: service cores
    # outside ALCF's 12-rank binding); stop_copper.sh with the same when the job script exits
    usage = dict(re.findall(r"\[(-\w) (\w+)\]", COPPER_USAGE.splitlines()[0]))
    assert usage == {"-d": "log_dir_base", "-v": "CU_FUSE_MNT_VIEWDIR"}
    lines = calls.read_text().splitlines()
    assert lines[0] == "module load copper"
    logs = f"{tmp_path / 'wd'}/copper-logs"
    assert lines[1] == f"launch_copper.sh -d {logs} -v {mount} -b 49,50,51,101"
    assert lines[2] == f"stop_copper.sh -d {logs} -v {mount}"
    # Copper that does not start: the ranks import from Lustre as before, and the job says so
    _fake_command(bindir, "launch_copper.sh", "exit 1\n")
    failed = subprocess.run(["bash", "-c", module + script + "\nenv -0"], env=start, capture_output=True, timeout=60)
    assert failed.returncode == 0 and b"PYTHONPATH=/opt/app\0" in failed.stdout
    assert b"Copper did not start" in failed.stderr
    # the launch line passes the job's environment to every rank (the page: --genvall)
    line = _launch_line("{kind: aurora, account: p, copper: true}", tmp_path)
    assert "--envall" in line and "PYTHONPATH" not in line


def test_dry_run_shows_copper_in_the_job_script(tmp_path: Path) -> None:
    s = spec.loads("name: d\nsite: {kind: aurora, account: p, copper: true}\nstages:\n  - kind: smoke\n", "d.yaml")
    text = dryrun.render_dry_run(s, tmp_path / "wd")
    assert "module load copper" in text and 'launch_copper.sh -d "${PBS_O_WORKDIR}/copper-logs"' in text
    assert "launch_copper.sh" not in dryrun.render_dry_run(
        spec.loads("name: d\nsite: {kind: aurora, account: p}\nstages:\n  - kind: smoke\n", "d.yaml"), tmp_path / "wd")


# https://docs.alcf.anl.gov/aurora/running-jobs-aurora/ @ 512a0056, "Recommended PBSPro options follow."
PBS_OPTIONS = """\
#!/bin/bash -l
#PBS -A <your_ProjectName>
#PBS -N <your_JobName>
#PBS -l walltime=<requested_walltime_value>
#PBS -l filesystems=<requested_fs1:requested_fs2>
#PBS -k doe
#PBS -l place=scatter
#PBS -q <requested_Queue>
"""
# https://docs.alcf.anl.gov/polaris/applications-and-libraries/libraries/nccl/, nccl.md @ ed3908de (2025-01-21):
# "We have done extensive performance tests and identified the following best environment setup."
POLARIS_NCCL = """\
export NCCL_NET_GDR_LEVEL=PHB
export NCCL_CROSS_NIC=1
export NCCL_COLLNET_ENABLE=1
export NCCL_NET="AWS Libfabric"
export LD_LIBRARY_PATH=/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib:$LD_LIBRARY_PATH
export LD_LIBRARY_PATH=/soft/libraries/hwloc/lib/:$LD_LIBRARY_PATH
export FI_CXI_DISABLE_HOST_REGISTER=1
export FI_MR_CACHE_MONITOR=userfaultfd
export FI_CXI_DEFAULT_CQ_SIZE=131072
"""


def test_the_job_script_has_every_pbs_option_alcf_recommends(tmp_path: Path) -> None:
    site = AuroraSite(account="proj", queue="debug-scaling", nodes=2, walltime="00:30:00")
    script, (qsub,) = site.dry_run(tmp_path / "parsl" / "000" / "submit_scripts")
    assert script.splitlines()[0] == PBS_OPTIONS.splitlines()[0]  # a login shell
    given = {"-A": "proj", "-q": "debug-scaling", "-l walltime": "00:30:00", "-l filesystems": "home:flare"}
    for line in PBS_OPTIONS.splitlines()[1:]:
        option, _, value = line.removeprefix("#PBS ").partition("<")
        option = option.rstrip("= ")
        if option == "-N":
            assert "#PBS -N parsl.campaign.block-0." in script
        elif value:  # a value the user gives: on a #PBS line or on the qsub line (Parsl puts -A, -q there)
            want = given[option]
            assert f"#PBS {option}={want}" in script or f" {option} {want} " in qsub, option
        else:
            assert line in script.splitlines(), line


@needs_bash
def test_polaris_ranks_get_the_nccl_pages_setup(tmp_path: Path) -> None:
    from campaign.executors.polaris import PolarisSite

    start = {"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": "/soft/conda/lib"}
    page = _bash_env(POLARIS_NCCL, start)
    site = PolarisSite(account="p", worker_init="export LD_LIBRARY_PATH=/soft/conda/lib")
    ours = {**_bash_env(site.provider().worker_init, start), **site.launch_options().env}
    set_by_page = {k for k in page if page[k] != start.get(k)} - {"_", "SHLVL", "PWD"}
    assert {k: ours.get(k) for k in set_by_page} == {k: page[k] for k in set_by_page}


# https://docs.alcf.anl.gov/aurora/workflows/parsl/, docs/aurora/workflows/parsl.md @ dc465358 (2026-07-16),
# "Known Issues" (since 68b28692, 2025-10-16):
TMPDIR_AURORA = ("Starting in October 2025, users testing parsl in single node jobs may encounter an error that makes "
                 "reference to `OSError: AF_UNIX path too long`.  To fix this, include in the `worker_init` when using "
                 "the `PBSProProvider` or in the job script for cases using the `LocalProvider` this environment "
                 "variable setting: `export TMPDIR=/tmp`")
# https://docs.alcf.anl.gov/polaris/workflows/parsl/, docs/polaris/workflows/parsl.md @ fb0b8c2d (2026-08-04),
# "Known Issues" (since 177dcd66, 2025-10-16):
TMPDIR_POLARIS = ("Starting in September 2025, users testing parsl in single node jobs may encounter an error that makes "
                  "reference to `OSError: AF_UNIX path too long`.  To fix this, include in the `worker_init` for cases "
                  "using the `PBSProProvider` or in the job script for cases using the `LocalProvider` this environment "
                  "variable setting: `export TMPDIR=/tmp`")


@needs_bash
@pytest.mark.parametrize("kind, quote", [("aurora", TMPDIR_AURORA), ("polaris", TMPDIR_POLARIS)])
def test_pbs_workers_start_with_the_tmpdir_alcfs_parsl_pages_name(kind: str, quote: str) -> None:
    from parsl.providers import PBSProProvider

    from campaign.executors.polaris import PolarisSite

    line = re.search(r"`(export TMPDIR=(\S+))`$", quote)  # type: ignore[union-attr]
    assert line is not None and "`worker_init`" in quote and "`PBSProProvider`" in quote
    export, value = line.groups()
    cls = {"aurora": AuroraSite, "polaris": PolarisSite}[kind]
    provider = cls(account="p", worker_init="export MINE=1").provider()
    assert isinstance(provider, PBSProProvider)
    lines = provider.worker_init.splitlines()
    assert export in lines and lines.index(export) < lines.index("export MINE=1")  # the user's own TMPDIR still wins
    # PBS Pro's per-job TMPDIR, which the job starts with, gives way to the page's
    job = _bash_env(provider.worker_init, {"PATH": os.environ["PATH"], "TMPDIR": "/var/tmp/pbs.8123456.aurora-pbs-0001"})
    assert job["TMPDIR"] == value
    assert "TMPDIR" not in cls(account="p", tmpdir=None).provider().worker_init


# https://docs.alcf.anl.gov/aurora/data-management/lustre/flare/, docs/aurora/data-management/lustre/flare.md
# @ 14bd245f (2025-01-28, the page's newest commit; the sentence in this wording since that commit):
FLARE = ("**Flare** is a 91 PB Lustre Filesystem with 160 OSTs, 40 MDTs, and 48 Gateway nodes mounted at "
         "`/lus/flare/projects/` with a peak theoretical performance of 650 GB/s. You should launch jobs only from "
         "this Flare space.")


def test_runs_start_from_the_flare_space_alcfs_flare_page_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mount = Path(re.search(r"mounted at `(/[^`]+)`", FLARE).group(1))  # type: ignore[union-attr]
    advice = re.search(r"(launch jobs only from) this (\w+) space", FLARE)
    assert advice is not None
    site = AuroraSite(account="AuroraGPT")
    # the endpoint's default work directory is in that space, and a work directory there draws no warning
    assert site.remote_workdir() == mount / "AuroraGPT" / "campaigns"
    assert site.workdir_warnings(mount / "AuroraGPT" / "campaigns", remote=True) == []
    assert site.workdir_warnings(mount / "AuroraGPT" / "c", remote=False) == []
    # elsewhere (home, or a relative path the endpoint resolves in $HOME): a warning in the page's words
    monkeypatch.setenv("HOME", str(tmp_path))
    for workdir, remote in ((tmp_path / "campaigns", False), (Path("campaigns"), True), (Path("/home/me/c"), True)):
        (warning,) = site.workdir_warnings(workdir, remote=remote)
        assert f"{advice.group(1)} {advice.group(2)}" in warning
        assert f"--workdir {mount / 'AuroraGPT' / 'campaigns'}" in warning


# https://docs.alcf.anl.gov/aurora/running-jobs-aurora/ @ 512a0056, "Binding MPI ranks to GPUs" (since 94904579,
# 2025-04-21): the frameworks module's hierarchy, the --gpu-bind warning, and the second of the page's two failed
# launches (its GPU_BIND_SCHEME line as written here since b1049143, 2025-05-14, which removed a doubled prefix).
FRAMEWORKS_FLAT = "The `frameworks` module sets `ZE_FLAT_DEVICE_HIERARCHY=FLAT`, treating each tile as a device."
GPU_BIND_LIMITS = ("There are several limitations with using `--gpu-bind=list` namely (a) for implict-scaling via "
                   "`--gpu-bind=list:0:1:2:3:4:5`, (b) With a different device-discovery hierarchy, "
                   "`ZE_FLAT_DEVICE_HIERARCHY=FLAT`. This is mode preferred for AI/ML frameworks.")
GPU_BIND_FAILS = """\
$ export ZE_FLAT_DEVICE_HIERARCHY=FLAT
$ export CPU_BIND_SCHEME="--cpu-bind=list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100"
$ export GPU_BIND_SCHEME="--gpu-bind=list:0:1:2:3:4:5:6:7:8:9:10:11"
$ mpiexec -n 12 -ppn 12 ${CPU_BIND_SCHEME} ${GPU_BIND_SCHEME} ./hello_affinity_aurora.out | sort
launch failed on x4520c2s0b0n0: Failed to parse implicit GPU selection
"""


def test_ranks_get_the_frameworks_modules_flat_hierarchy_and_no_gpu_bind(tmp_path: Path) -> None:
    flat = re.search(r"`ZE_FLAT_DEVICE_HIERARCHY=(\w+)`", FRAMEWORKS_FLAT).group(1)  # type: ignore[union-attr]
    limit_b = re.search(r"\(b\) [^`]*`ZE_FLAT_DEVICE_HIERARCHY=(\w+)`", GPU_BIND_LIMITS)
    assert limit_b is not None and limit_b.group(1) == flat  # --gpu-bind=list's limitation (b) is that hierarchy
    site = AuroraSite(account="p")
    assert site.device_hierarchy == flat and site.launch_options().env["ZE_FLAT_DEVICE_HIERARCHY"] == flat
    assert site.launch_options().gpu_bind is None
    line = _launch_line("{kind: aurora, account: p}", tmp_path)
    assert f"--env ZE_FLAT_DEVICE_HIERARCHY={flat}" in line and "--gpu-bind" not in line
    # the page's failed launch under that hierarchy: its CPU list is ours, its --gpu-bind is refused at validate
    exports = dict(re.findall(r'^\$ export (\w+)="?(.*?)"?$', GPU_BIND_FAILS, re.M))
    assert exports["ZE_FLAT_DEVICE_HIERARCHY"] == flat
    assert GPU_BIND_FAILS.splitlines()[-1].endswith("Failed to parse implicit GPU selection")
    assert f"--cpu-bind={site.launch_options().cpu_bind}" == exports["CPU_BIND_SCHEME"]
    gpu_bind = exports["GPU_BIND_SCHEME"].removeprefix("--gpu-bind=")
    with pytest.raises(SpecError, match=f"site.gpu_bind: .*fails with ZE_FLAT_DEVICE_HIERARCHY={flat}"):
        spec.loads(f"name: g\nsite: {{kind: aurora, account: p, gpu_bind: '{gpu_bind}'}}\nstages:\n  - kind: smoke\n",
                   "g.yaml")


# https://docs.alcf.anl.gov/aurora/workflows/parsl/, docs/aurora/workflows/parsl.md @ dc465358 (2026-07-16),
# "Parsl Config for Ensemble of Multinode MPI tasks" (since 1da0a7c2, 2025-01-16):
PARSL_MPI = ("In order to run applications that have MPI communication, `mpiexec` has to be used a different way by "
             "Parsl.  To run MPI applications, use the `SimpleLauncher` and the `MPIExecutor`.")
PARSL_MPI_PROVIDER = """\
                scheduler_options="#PBS -l filesystems=home:flare",
                launcher=SimpleLauncher(),
                select_options="",
                nodes_per_block=nodes_per_job,
                max_blocks=1,
                cpus_per_node=208,
"""


def test_aurora_blocks_use_the_provider_settings_of_alcfs_parsl_page(tmp_path: Path) -> None:
    import parsl.launchers
    from parsl.providers import PBSProProvider

    launcher = re.search(r"use the `(\w+)`", PARSL_MPI).group(1)  # type: ignore[union-attr]
    page = dict(re.findall(r"^\s*(\w+)=(.*),$", PARSL_MPI_PROVIDER, re.M))
    assert page["launcher"] == f"{launcher}()"
    directive = page["scheduler_options"].strip('"')
    cpus = int(page["cpus_per_node"])
    p = AuroraSite(account="p").parsl_config(tmp_path).executors[0].provider
    assert isinstance(p, PBSProProvider) and type(p.launcher) is getattr(parsl.launchers, launcher)
    assert p.cpus_per_node == cpus and directive in p.scheduler_options.splitlines()
    block = AuroraSite(account="p", queue="capacity", nodes=3, spares=1)
    script, _ = block.dry_run(tmp_path / "parsl" / "000" / "submit_scripts")
    assert directive in script.splitlines() and f"#PBS -l select=4:ncpus={cpus}" in script.splitlines()


# https://docs.alcf.anl.gov/polaris/workflows/parsl/, docs/polaris/workflows/parsl.md @ fb0b8c2d (2026-08-04;
# this executor since 1b11df2d, 2025-02-28, which removed `address=address_by_interface("bond0")`):
POLARIS_PARSL_EXECUTOR = """\
            HighThroughputExecutor(
                label="htex",
                heartbeat_period=15,
                heartbeat_threshold=120,
                worker_debug=True,
                available_accelerators=user_opts["available_accelerators"],
                max_workers_per_node=user_opts["available_accelerators"],
                # This give optimal binding of threads to GPUs on a Polaris node
                cpu_affinity="list:24-31,56-63:16-23,48-55:8-15,40-47:0-7,32-39",
                prefetch_capacity=0,
                provider=PBSProProvider(
                    launcher=MpiExecLauncher(bind_cmd="--cpu-bind", overrides="--depth=64 --ppn 1"),
                    account=user_opts["account"],
                    queue=user_opts["queue"],
                    select_options="ngpus=4",
                    # PBS directives (header lines)
                    scheduler_options=user_opts["scheduler_options"],
                    # Command to be run before starting a worker, such as:
                    worker_init=user_opts["worker_init"],
                    # number of compute nodes allocated for each block
                    nodes_per_block=user_opts["nodes_per_block"],
                    init_blocks=1,
                    min_blocks=0,
                    max_blocks=1, # Can increase more to have more parallel jobs
                    cpus_per_node=user_opts["cpus_per_node"],
                    walltime=user_opts["walltime"]
                ),
            ),
"""


def test_polaris_workers_get_the_address_alcfs_parsl_page_gives_none(tmp_path: Path) -> None:
    import inspect

    from parsl.executors import HighThroughputExecutor

    from campaign.executors.polaris import PolarisSite

    indent = len(POLARIS_PARSL_EXECUTOR.splitlines()[1]) - len(POLARIS_PARSL_EXECUTOR.splitlines()[1].lstrip())
    named = set(re.findall(rf"^ {{{indent}}}(\w+)=", POLARIS_PARSL_EXECUTOR, re.M))
    assert {"label", "cpu_affinity", "provider"} <= named and "address" not in named
    page_gets = inspect.signature(HighThroughputExecutor).parameters["address"].default
    exe = PolarisSite(account="p").parsl_config(tmp_path).executors[0]
    assert isinstance(exe, HighThroughputExecutor) and exe.address == page_gets  # Parsl offers every address


# https://docs.alcf.anl.gov/aurora/running-jobs-aurora/ @ 512a0056, "MPI rank and thread binding to cores and
# GPUs" (since 94904579, 2025-04-21):
RESERVED_CORES = ("Since March 31, 2025, cores 0 (104) and 52 (156)--the first physical cores on each CPU "
                  "socket—have been reserved for system services, and are no longer available for user applications.")


@pytest.mark.parametrize("ranks", [2, 4, 6, 8, 12, 16, 24, 32, 48, 96])
def test_no_rank_and_no_copper_service_is_bound_to_the_cores_alcf_reserves(ranks: int) -> None:
    pairs = [(int(a), int(b)) for a, b in re.findall(r"(\d+) \((\d+)\)", RESERVED_CORES)]
    assert len(pairs) == 2 and "first physical cores on each CPU socket" in RESERVED_CORES
    reserved = {core for pair in pairs for core in pair}  # each physical core and its hyperthread
    assert tuple(core for core, _ in pairs) == aurora.RESERVED_CORES
    assert all(thread - core == aurora.PHYSICAL_CORES for core, thread in pairs)
    # each socket's first core is the system's: the ranks' lists start one past it
    assert aurora.SOCKET_FIRST_CORES == tuple(core + 1 for core, _ in pairs)
    cpu_bind = aurora.cpu_bind_list(ranks)  # what `cpu_bind: auto` gives that many ranks
    assert cpu_bind is not None
    if ranks in (6, 12):
        site = AuroraSite(account="p", ranks_per_node=ranks, device_hierarchy="COMPOSITE" if ranks == 6 else "FLAT")
        assert site.launch_options().cpu_bind == cpu_bind
    logical = {c for part in re.split(r"[:,]", cpu_bind.removeprefix("list:"))
               for c in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)}
    assert not logical & reserved and not aurora.bound_cores(cpu_bind) & reserved
    assert not set(aurora.copper_cores(cpu_bind) or aurora.COPPER_SERVICE_CORES) & reserved
