"""The batch site models (aurora, polaris, slurm), walltime parsing and warnings, the
Parsl configs they build, and the dry run (which must write nothing)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from campaign.errors import SiteError, SpecError
from campaign import executors, spec, walltime
from campaign.executors import aurora, batch, pbs, polaris
from campaign.executors.base import LaunchOptions, Site
from campaign.executors.aurora import AuroraSite
from campaign.executors.polaris import PolarisSite
from campaign.executors.slurm import SlurmSite

REPO = Path(__file__).resolve().parents[2]


def _spec(site: str, stages: str = "  - kind: smoke\n") -> spec.CampaignSpec:
    return spec.loads(f"name: demo\nsite:\n{site}stages:\n{stages}", "demo.yaml")


@pytest.mark.parametrize(("text", "seconds"), [("00:00:01", 1), ("06:00:00", 21600), ("1:30:00", 5400),
                                               ("100:00:00", 360000), (" 00:10:00 ", 600)])
def test_walltime_seconds(text: str, seconds: int) -> None:
    assert batch.walltime_seconds(text) == seconds


@pytest.mark.parametrize("text", ["6h", "00:60:00", "00:00:60", "10:00", "", "1:2:3", "-1:00:00"])
def test_walltime_refuses_other_forms(text: str) -> None:
    with pytest.raises(ValueError, match="HH:MM:SS"):
        batch.walltime_seconds(text)


def test_every_site_kind_is_registered_with_a_module() -> None:
    assert executors.KINDS == ("local", "aurora", "polaris", "slurm")
    for kind in executors.KINDS:
        mod = executors.module(kind)
        assert mod.__doc__ and "Fields a user changes" in mod.__doc__
        (cls,) = [c for c in vars(mod).values() if isinstance(c, type) and issubclass(c, Site)
                  and c.model_fields.get("kind") and c.model_fields["kind"].default == kind]
        assert not getattr(cls, "__abstractmethods__", None), f"{cls.__name__} leaves {cls.__abstractmethods__} open"


def test_a_site_that_misses_part_of_the_contract_cannot_be_made() -> None:
    class Half(Site):
        def launch_options(self) -> LaunchOptions:
            return LaunchOptions()

    with pytest.raises(TypeError, match="parsl_config"):
        Half()


def test_aurora_defaults_follow_the_alcf_docs() -> None:
    site = AuroraSite(account="p")
    assert (site.ranks_per_node, site.launcher, site.filesystems, site.place) == (12, "pals", "home:flare", "scatter")
    assert site.node_names() is None and site.walltime_s == 3600
    opts = site.launch_options()
    # FLAT set by us, no --gpu-bind (it fails under FLAT: docs.alcf.anl.gov/aurora/running-jobs-aurora/)
    assert opts.cpu_bind == aurora.CPU_BIND and opts.gpu_bind is None
    assert opts.env["ZE_FLAT_DEVICE_HIERARCHY"] == "FLAT" and site.device_hierarchy == "FLAT"
    composite = AuroraSite(account="p", device_hierarchy="COMPOSITE", gpu_bind=aurora.GPU_BIND)
    assert composite.launch_options().env["ZE_FLAT_DEVICE_HIERARCHY"] == "COMPOSITE"
    # the single-machine stand-in: no PALS binding, loopback rendezvous
    assert AuroraSite(account="p", launcher="mpich").launch_options() == LaunchOptions(env={"MASTER_ADDR": "127.0.0.1"})


def _job_env(worker_init: str, env: dict[str, str]) -> dict[str, str]:
    """The environment after a job's worker_init ran in bash (what the Parsl worker, and so
    every rank through mpiexec --envall, inherits)."""
    out = subprocess.run(["bash", "-c", worker_init + "\nenv -0"], env=env, capture_output=True, check=True, timeout=30)
    return dict(line.split("=", 1) for line in out.stdout.decode().split("\0") if "=" in line)


def test_aurora_ranks_get_the_oneccl_environment_alcf_lists_today_which_env_overrides() -> None:
    # https://docs.alcf.anl.gov/aurora/data-science/frameworks/oneCCL/ "oneCCL environment variables"
    # (oneCCL.md @ f2eb40a6, 2026-03-17): the minimal set and the tuning block; the page's own
    # lines are run against the rendered job in tests/unit/test_alcf_facts.py. Here: `env` overrides
    # one, and `collective_env: false` leaves the ranks and the job without them.
    env = AuroraSite(account="p").launch_options().env
    assert env["FI_MR_CACHE_MONITOR"] == "userfaultfd" and env["CCL_KVS_MODE"] == "mpi"
    assert "CCL_CONFIGURATION_PATH" not in env  # exported in the job's shell, as the page does
    mine = AuroraSite(account="p", env={"CCL_KVS_CONNECTION_TIMEOUT": "1200"}).launch_options().env
    assert mine["CCL_KVS_CONNECTION_TIMEOUT"] == "1200" and mine["CCL_KVS_MODE"] == "mpi"
    off = AuroraSite(account="p", collective_env=False)
    assert off.launch_options().env == {"ZE_FLAT_DEVICE_HIERARCHY": "FLAT", "ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1"}
    assert off.job_environment() == [pbs.CD_SUBMIT_DIR]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not available")
def test_aurora_jobs_run_the_pages_shell_lines_after_the_users_modules() -> None:
    # The same block: `export MPI_PROVIDER=$FI_PROVIDER` (FI_PROVIDER comes from `module load
    # frameworks`, here from the user's worker_init) and three `unset MPIR_CVAR_..._TUNING_JSON_FILE`.
    init = AuroraSite(account="p", worker_init="export FI_PROVIDER=cxi").provider().worker_init
    tuning = ("MPIR_CVAR_CH4_POSIX_COLL_SELECTION_TUNING_JSON_FILE", "MPIR_CVAR_CH4_COLL_SELECTION_TUNING_JSON_FILE",
              "MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE")
    job = _job_env(init, {"PATH": os.environ["PATH"], **{k: "/opt/tuning.json" for k in tuning}})
    assert job["MPI_PROVIDER"] == "cxi" and not any(k in job for k in tuning)
    assert "MPI_PROVIDER" not in _job_env(AuroraSite(account="p").provider().worker_init, {"PATH": os.environ["PATH"]})


def test_polaris_ranks_get_alcfs_nccl_environment_and_its_plugin_on_the_library_path(tmp_path: Path) -> None:
    # https://docs.alcf.anl.gov/polaris/applications-and-libraries/libraries/nccl/ (nccl.md @ ed3908de, 2025-01-21):
    # NCCL_NET="AWS Libfabric" with "export LD_LIBRARY_PATH=/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib:$LD_LIBRARY_PATH"
    # and "export LD_LIBRARY_PATH=/soft/libraries/hwloc/lib/:$LD_LIBRARY_PATH".
    site = PolarisSite(account="p", worker_init="export LD_LIBRARY_PATH=/soft/conda/lib")
    env = site.launch_options().env
    assert (env["NCCL_NET"], env["FI_MR_CACHE_MONITOR"], env["FI_CXI_DEFAULT_CQ_SIZE"]) == ("AWS Libfabric", "userfaultfd", "131072")
    job = _job_env(site.provider().worker_init, {"PATH": os.environ["PATH"]})
    assert job["LD_LIBRARY_PATH"] == "/soft/libraries/hwloc/lib/:/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib:/soft/conda/lib"
    off = PolarisSite(account="p", collective_env=False)
    assert "NCCL_NET" not in off.launch_options().env and "aws-ofi-nccl" not in off.provider().worker_init


def test_polaris_workers_connect_on_every_address_unless_told_an_interface(tmp_path: Path) -> None:
    # https://docs.alcf.anl.gov/polaris/workflows/parsl/ (parsl.md @ fb0b8c2d, 2026-08-04) sets no `address`;
    # its old bond0 advice is gone. A named interface this host lacks is a clear error.
    site = PolarisSite(account="p")
    assert site.address_interface is None and batch.worker_address(site) is None
    bond0 = PolarisSite(account="p", address_interface="bond0")
    with pytest.raises(SiteError, match="site.address_interface: no address for interface 'bond0'"):
        bond0.parsl_config(tmp_path)  # this machine has no bond0: a clear error, not Parsl's traceback
    script, _ = bond0.dry_run(tmp_path)  # the dry run does not need the interface
    assert "<address of bond0>" in script or "bond0" not in script
    lo = PolarisSite(account="p", address_interface="lo").parsl_config(tmp_path)
    assert lo.executors[0].address == "127.0.0.1"


def test_pbs_jobs_export_a_short_tmpdir_before_the_users_init() -> None:
    # Python's multiprocessing binds AF_UNIX sockets (<= 107 bytes) under TMPDIR; PBS's is per job.
    p = AuroraSite(account="p", worker_init="module load frameworks").provider()
    lines = p.worker_init.splitlines()
    assert lines.index("export TMPDIR=/tmp") < lines.index("module load frameworks")
    assert "TMPDIR" not in AuroraSite(account="p", tmpdir=None).provider().worker_init
    assert "TMPDIR" not in SlurmSite().provider().worker_init


def test_polaris_binds_by_depth_wraps_for_gpus_and_disables_nvlink_multicast() -> None:
    opts = PolarisSite(account="p").launch_options()
    assert opts.cpu_bind == "depth" and opts.depth == 8 and opts.wrapper == polaris.GPU_WRAPPER
    assert opts.env["NCCL_NVLS_ENABLE"] == "0" and opts.env["NVSHMEM_DISABLE_NVLS"] == "1"


def test_slurm_site_uses_srun() -> None:
    site = SlurmSite(partition="debug", cpus_per_task=4, env={"X": "1"})
    assert site.launcher == "srun" and site.ranks_per_node == 1
    assert site.launch_options() == LaunchOptions(env={"X": "1"}, depth=4)


def test_pbs_parsl_config_is_fresh_one_block_one_worker(tmp_path: Path) -> None:
    from parsl.launchers import SimpleLauncher
    from parsl.providers import PBSProProvider

    site = AuroraSite(account="proj", queue="capacity", nodes=4, spares=2, walltime="02:00:00",
                      worker_init="module load frameworks")
    a, b = site.parsl_config(tmp_path), site.parsl_config(tmp_path)
    assert a is not b and a.executors[0] is not b.executors[0]
    exe = a.executors[0]
    p = exe.provider
    assert exe.label == "campaign" and exe.max_workers_per_node == 1
    assert isinstance(p, PBSProProvider) and isinstance(p.launcher, SimpleLauncher)
    assert (p.nodes_per_block, p.init_blocks, p.min_blocks, p.max_blocks) == (6, 1, 0, 1)
    assert (p.account, p.queue, p.walltime, p.cpus_per_node) == ("proj", "capacity", "02:00:00", 208)
    assert "#PBS -l filesystems=home:flare" in p.scheduler_options and "place=scatter" in p.scheduler_options
    # the user's init runs after ours (it wins), then ALCF's shell lines that need its modules
    lines = p.worker_init.splitlines()
    assert lines[lines.index("module load frameworks") + 1:] == [pbs.CD_SUBMIT_DIR, *aurora.COLLECTIVE_JOB_LINES]
    assert a.strategy == "simple"  # a new block when the old one reached its walltime


@pytest.mark.parametrize("site", [AuroraSite(account="p"), SlurmSite()], ids=["aurora", "slurm"])
def test_batch_jobs_find_parsls_scripts_on_path_when_they_are_not_beside_the_interpreter(
        site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pip install --target DIR` puts interchange.py and process_worker_pool.py in DIR/bin, not
    beside the interpreter: the interchange and the job's PATH use the ones PATH finds."""
    scripts = tmp_path / "target" / "bin"
    scripts.mkdir(parents=True)
    for name in ("interchange.py", "process_worker_pool.py"):
        (scripts / name).write_text("#!/bin/sh\n")
        (scripts / name).chmod(0o755)
    (tmp_path / "python" / "bin").mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python" / "bin" / "python3"))
    monkeypatch.setenv("PATH", f"{scripts}:/usr/bin:/bin")
    exe = site.parsl_config(tmp_path).executors[0]
    assert exe.interchange_launch_cmd[-1] == str(scripts / "interchange.py")
    assert exe.provider.worker_init.startswith(f"export PATH={scripts}:$PATH")


def test_cancel_jobs_registers_unknown_ids_then_cancels(monkeypatch: pytest.MonkeyPatch) -> None:
    from parsl.providers import PBSProProvider

    calls = []
    monkeypatch.setattr(PBSProProvider, "execute_wait", lambda self, cmd, timeout=None: (calls.append(cmd), (0, "", ""))[1])
    assert AuroraSite(account="p").cancel_jobs(["123.pbs"]) == [True]
    assert calls == ["qdel 123.pbs"]


def test_spec_refuses_bad_site_fields_with_file_and_line() -> None:
    with pytest.raises(Exception) as info:
        _spec("  kind: slurm\n  partiton: debug\n")
    assert "site.partiton: unknown key; did you mean 'partition'?" in str(info.value)
    assert "(demo.yaml, line 4)" in str(info.value)


def test_no_warning_when_the_stages_fit() -> None:
    s = _spec("  kind: aurora\n  account: p\n  walltime: '01:00:00'\n", "  - kind: smoke\n    timeout_s: 600\n")
    assert walltime.warnings(s) == []


def test_warns_when_a_stage_timeout_exceeds_the_walltime() -> None:
    s = _spec("  kind: slurm\n  walltime: '00:10:00'\n", "  - kind: smoke\n    timeout_s: 900\n")
    (warning, total) = walltime.warnings(s)
    assert "stage smoke: timeout_s 900 s is longer than the block walltime 00:10:00" in warning
    assert "need up to ~15 min in all" in total


def test_warns_when_the_long_run_needs_several_blocks() -> None:
    s = _spec("  kind: aurora\n  account: p\n  queue: capacity\n  walltime: '06:00:00'\n  expected_tokens_per_s: 1.0e6\n",
              "  - kind: long_run\n    tokens: 100000000000\n")
    warnings = walltime.warnings(s)
    assert any("stage long_run needs ~27.8 h (100,000,000,000 tokens at 1,000,000 tokens/s)" in w and "~5 blocks" in w
               for w in warnings), warnings
    # a measured throughput (e.g. from the ledger) overrides the hint
    assert not any("long_run needs" in w for w in walltime.warnings(s, tokens_per_s=1e8))


def test_long_run_without_throughput_says_what_to_set() -> None:
    s = _spec("  kind: slurm\n", "  - kind: long_run\n    tokens: 1000000\n")
    assert any("set site.expected_tokens_per_s" in w for w in walltime.warnings(s))


def test_local_site_has_no_walltime_to_check() -> None:
    assert walltime.warnings(_spec("  kind: local\n", "  - kind: smoke\n    timeout_s: 99999\n")) == []


def test_dry_run_prints_script_and_commands_and_writes_nothing(tmp_path: Path, run_cli) -> None:
    work = tmp_path / "wd"
    code, out, err = run_cli("submit", str(REPO / "examples" / "auroragpt-2b.yaml"), "--dry-run", "--workdir", str(work))
    assert code == 0, err
    assert not work.exists()
    assert "#PBS -l select=528:ncpus=208" in out and "qsub  -q prod -A YOUR_PROJECT" in out
    assert "mpiexec -n 6144 --ppn 12 --hostfile" in out  # smoke on all 512 nodes
    assert out.count("\n## stage ") == 5


@pytest.mark.parametrize("example", ["auroragpt-2b", "polaris", "slurm-cluster"])
def test_batch_examples_validate_and_dry_run(example: str, tmp_path: Path, run_cli) -> None:
    code, out, err = run_cli("submit", str(REPO / "examples" / f"{example}.yaml"), "--dry-run",
                             "--workdir", str(tmp_path / "wd"))
    assert code == 0, err
    assert ("sbatch" if example == "slurm-cluster" else "qsub") in out
    assert not (tmp_path / "wd").exists()


def test_aurora_warns_when_runs_would_start_from_home_not_flare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # docs.alcf.anl.gov/aurora/data-management/lustre/flare/: launch jobs only from /lus/flare/projects
    site = AuroraSite(account="AuroraGPT")
    (remote_rel,) = site.workdir_warnings(Path("campaigns"), remote=True)
    assert "resolves under $HOME" in remote_rel and "--workdir /lus/flare/projects/AuroraGPT/campaigns" in remote_rel
    assert site.workdir_warnings(Path("/lus/flare/projects/AuroraGPT/campaigns"), remote=True) == []
    assert "not under /lus/flare/projects" in site.workdir_warnings(Path("/home/me/c"), remote=True)[0]
    monkeypatch.setenv("HOME", str(tmp_path))
    assert "under your home directory" in site.workdir_warnings(tmp_path / "campaigns", remote=False)[0]
    assert site.workdir_warnings(Path("/lus/flare/projects/AuroraGPT/c"), remote=False) == []
    assert SlurmSite().workdir_warnings(Path("campaigns"), remote=True) == []


def test_a_remote_aurora_submit_without_workdir_runs_on_flare(tmp_path: Path, run_cli,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15 item 5: on Aurora the endpoint's default work directory is the project's
    directory on Flare, not $HOME. The boundary faked: `campaign.remote.submit`, the call that
    would reach the Globus Compute endpoint; what the CLI hands it is what is checked."""
    from campaign import remote

    example = (Path(__file__).resolve().parents[2] / "examples" / "auroragpt-2b.yaml").read_text()
    spec = yaml.safe_load(example.replace("YOUR_PROJECT", "AuroraGPT"))  # the preflight refuses placeholders
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    sent: list[Path] = []

    def fake_submit(endpoint_id: str, file: Path, workdir: Path, db_url: str | None, new_version: bool) -> dict:
        sent.append(workdir)
        return {"name": spec["name"], "attached": False, "host": "aurora-uan-0009", "pid": 1, "ledger": "l", "log": "x"}

    monkeypatch.setattr(remote, "submit", fake_submit)
    uuid = "2b1f8a9e-6c3d-4e5f-8a7b-9c0d1e2f3a4b"
    code, out, err = run_cli("submit", path, "--endpoint", uuid)
    assert code == 0, err
    assert sent == [Path("/lus/flare/projects/AuroraGPT/campaigns")]
    assert "runs in /lus/flare/projects/AuroraGPT/campaigns on the endpoint's host" in err
    assert "resolves under $HOME" not in err and "--workdir /lus/flare/projects/AuroraGPT/campaigns" in out
    code, out, err = run_cli("submit", path, "--endpoint", uuid, "--workdir", "/lus/flare/projects/AuroraGPT/x")
    assert code == 0 and sent[-1] == Path("/lus/flare/projects/AuroraGPT/x") and "note:" not in err


def test_submit_without_the_polaris_interface_stops_before_the_ledger(tmp_path: Path, run_cli) -> None:
    # this machine has no bond0 (ALCF's old interface for Parsl on Polaris): one line, exit 2, nothing written
    workdir = tmp_path / "work"
    example = Path(__file__).resolve().parents[2] / "examples" / "polaris.yaml"
    with_bond0 = tmp_path / "polaris.yaml"
    with_bond0.write_text(example.read_text().replace("  kind: polaris\n", "  kind: polaris\n  address_interface: bond0\n"))
    code, out, err = run_cli("submit", with_bond0, "--workdir", workdir)
    assert code == 2, err
    assert "preflight refused the submission" in err  # the list, one line a problem
    assert "\n  site.address_interface: no address for interface 'bond0' on this host" in err
    assert "Traceback" not in err and not workdir.exists()


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not available")
@pytest.mark.parametrize("kind", ["aurora", "polaris"])
def test_pbs_jobs_start_a_login_shell_so_worker_init_can_use_module(tmp_path: Path, kind: str) -> None:
    # ALCF's sample job scripts start `#!/bin/bash -l` (docs.alcf.anl.gov/aurora/workflows/parsl/,
    # parsl.md @ dc465358): `module` is a shell function defined by the login profile (Parsl issue 3538),
    # and `#PBS -S /bin/bash` would name the shell without -l. Here the script runs by its own #!
    # line, with a profile that defines `module` as the login scripts of the machines do.
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bash_profile").write_text('module() { echo "module $*"; }\n')
    site = executors.module(kind).__dict__[{"aurora": "AuroraSite", "polaris": "PolarisSite"}[kind]](
        account="p", worker_init="module load frameworks || exit 3; exit 0", collective_env=False)
    script, _ = site.dry_run(tmp_path / "scripts")
    assert script.startswith("#!/bin/bash -l\n") and "#PBS -S" not in script
    path = tmp_path / "job.sh"
    path.write_text(script)
    path.chmod(0o755)
    done = subprocess.run([str(path)], env={"HOME": str(home), "PATH": os.environ["PATH"]}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "module load frameworks" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("ranks, alcf", [
    # docs.alcf.anl.gov/aurora/running-jobs-aurora/ (running-jobs-aurora.md @ 512a0056, 2026-07-27), verbatim
    (12, "list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100"),
    (6, "list:1-16:17-32:33-48:53-68:69-84:85-100"),
])
def test_aurora_binds_each_rank_to_its_own_cores_on_both_sockets_as_alcf_lists(ranks: int, alcf: str) -> None:
    site = AuroraSite(account="p", ranks_per_node=ranks, device_hierarchy="COMPOSITE" if ranks == 6 else "FLAT")
    assert site.launch_options().cpu_bind == alcf
    from campaign.train.placement import launch_placement

    rows = launch_placement(site.launch_options(), ranks, "xpu", 6 if ranks == 6 else 12, rank_env=site.rank_variables)
    cpus = [r["cpus"] for r in rows]
    assert len(set(cpus)) == ranks and cpus[ranks // 2].startswith("53-"), "half the ranks on the second socket"


def test_aurora_refuses_a_rank_count_alcfs_cpu_lists_cannot_split() -> None:
    with pytest.raises(SpecError, match=r"site.cpu_bind: .* 5 ranks per node do not split so"):
        spec.loads("name: d\nsite: {kind: aurora, account: p, ranks_per_node: 5}\nstages:\n  - kind: smoke\n", "d.yaml")
    own = AuroraSite(account="p", ranks_per_node=5, cpu_bind="list:1-10:11-20:21-30:53-62:63-72")
    assert own.launch_options().cpu_bind == "list:1-10:11-20:21-30:53-62:63-72"
    assert AuroraSite(account="p", ranks_per_node=5, cpu_bind=None).launch_options().cpu_bind is None


def test_slurm_refuses_closest_gpu_binding_that_would_give_a_rank_two_gpus() -> None:
    # srun(1) (Slurm 22.05.8), --gpu-bind=closest: "each task may be bound to more than one GPU
    # (i.e. all GPUs in that NUMA environment)": on a 2-socket node with 4 GPUs, 4 ranks each see
    # 2 GPUs, and the trainer would put two ranks on one GPU. single:1 binds one GPU per task.
    text = "name: d\nsite: {kind: slurm, ranks_per_node: 4, gpus_per_node: 4, gpu_bind: %s}\nstages:\n  - kind: smoke\n"
    with pytest.raises(SpecError, match="site.gpu_bind: closest may bind each of the 4 ranks.*single:1"):
        spec.loads(text % "closest", "d.yaml")
    with pytest.raises(SpecError, match="site.gpu_bind: closest"):
        spec.loads(text % "'verbose,closest'", "d.yaml")
    site = spec.loads(text % "'single:1'", "d.yaml").site
    assert site.launch_options().gpu_bind == "single:1"
    one_rank = "name: d\nsite: {kind: slurm, ranks_per_node: 1, gpus_per_node: 4, gpu_bind: closest}\nstages:\n  - kind: smoke\n"
    assert spec.loads(one_rank, "d.yaml").site.gpu_bind == "closest"


def test_aurora_workers_connect_over_hsn0_where_the_drivers_host_has_it(tmp_path: Path) -> None:
    # ALCF's Aurora Parsl page uses the hsn0 address since dc465358 (2026-07-16; the quote's test:
    # test_alcf_facts.py). Taken only where the host has hsn0, so a host without it (this one)
    # keeps Parsl's every-address default, with a preflight warning, instead of failing.
    site = AuroraSite(account="p")
    assert batch.worker_address(site) is None  # no hsn0 here

    class LoopbackAurora(AuroraSite):
        PREFERRED_INTERFACE = "lo"  # an interface this host has, standing in for hsn0

    assert LoopbackAurora(account="p").parsl_config(tmp_path).executors[0].address == "127.0.0.1"
    assert LoopbackAurora(account="p", address="10.1.2.3").parsl_config(tmp_path).executors[0].address == "10.1.2.3"


@pytest.mark.parametrize("kind", ["aurora", "polaris"])
def test_pbs_jobs_mail_when_and_whom_the_site_says(tmp_path: Path, kind: str) -> None:
    # Parsl's PBS Pro template fixes `#PBS -m n`; the site's `mail` replaces that line (a second
    # -m line would leave PBS to pick one) and `mail_to` adds -M. The default stays `-m n`.
    cls = {"aurora": AuroraSite, "polaris": PolarisSite}[kind]
    script, _ = cls(account="p", mail="ae", mail_to=["me@example.org", "ops@example.org"]).dry_run(tmp_path / "a")
    assert [line for line in script.splitlines() if line.startswith(("#PBS -m", "#PBS -M"))] == \
        ["#PBS -m ae", "#PBS -M me@example.org,ops@example.org"]
    default, _ = cls(account="p").dry_run(tmp_path / "b")
    assert [line for line in default.splitlines() if line.startswith(("#PBS -m", "#PBS -M"))] == ["#PBS -m n"]
    assert not cls.COMPUTE_NODES_ONLINE, "W&B logs offline by default where compute nodes have no internet"
    for bad in ({"mail": "x"}, {"mail_to": ["me@example.org\n#PBS -l select=999"]}):
        with pytest.raises(ValueError):
            cls(account="p", **bad)
