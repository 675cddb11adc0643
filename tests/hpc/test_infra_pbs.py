"""The PBS Pro emulator (tests/infra/pbs: a STAND-IN for PBS Pro, which cannot run here)
driven by Parsl's real PBSProProvider, plus the PBS Pro behaviours campaign relies on."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from parsl.jobs.states import JobState
from parsl.launchers import SimpleLauncher
from provider_waits import pid_gone, wait_status
from parsl.providers import PBSProProvider

pytestmark = pytest.mark.slow

AURORA_OPTIONS = "#PBS -l filesystems=home:flare\n#PBS -l place=scatter"


def _provider(tmp_path, **kw) -> PBSProProvider:
    provider = PBSProProvider(account="campaign", queue="debug", select_options="ngpus=6",
                              nodes_per_block=2, cpus_per_node=208, launcher=SimpleLauncher(),
                              scheduler_options=AURORA_OPTIONS, walltime="00:05:00",
                              init_blocks=0, min_blocks=0, max_blocks=1, cmd_timeout=30, **kw)
    provider.script_dir = str(tmp_path)
    return provider


def _qsub(tmp_path, script: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    path = tmp_path / "job.sh"
    path.write_text(script)
    proc = subprocess.run(["qsub", *args, str(path)], capture_output=True, text=True, cwd=tmp_path, timeout=30)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_pbspro_provider_lifecycle(pbs_emulator, tmp_path):
    provider = _provider(tmp_path)
    job_id = provider.submit("echo JOBID=$PBS_JOBID QUEUE=$PBS_QUEUE ACCOUNT=$PBS_ACCOUNT; "
                             "cat $PBS_NODEFILE; sleep 1.5", tasks_per_node=1, job_name="infra-pbs")
    assert job_id.endswith(".aurora-pbs-0001.hostmgmt.cm.aurora.alcf.anl.gov"), job_id
    assert job_id.split(".")[0].isdigit()
    seen = wait_status(provider, job_id, {JobState.RUNNING})
    assert set(seen) <= {JobState.PENDING, JobState.RUNNING}, seen
    seen = wait_status(provider, job_id, {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
    assert seen[-1] == JobState.COMPLETED, seen

    out = open(provider.resources[job_id]["job_stdout_path"]).read().split()
    assert f"JOBID={job_id}" in out and "QUEUE=debug" in out and "ACCOUNT=campaign" in out, out
    assert out[-2:] == ["x4000c0s0b0n0", "x4000c0s1b0n0"], out  # place=scatter: each host once

    info = pbs_emulator.qstat(job_id)
    assert info["job_state"] == "F" and info["Exit_status"] == 0, info
    rl = info["Resource_List"]
    assert rl["select"] == "2:ncpus=208:ngpus=6" and rl["nodect"] == 2, rl
    assert rl["filesystems"] == "home:flare" and rl["place"] == "scatter" and rl["walltime"] == "00:05:00", rl
    assert info["Account_Name"] == "campaign" and info["queue"] == "debug"
    assert info["exec_host"] == "x4000c0s0b0n0/0*208+x4000c0s1b0n0/0*208"


def test_pbspro_provider_cancel_kills_the_job(pbs_emulator, tmp_path):
    provider = _provider(tmp_path)
    pid_file = tmp_path / "pid"
    job_id = provider.submit(f"echo $$ > {pid_file}; sleep 300 & echo $! >> {pid_file}; wait",
                             tasks_per_node=1, job_name="infra-pbs-cancel")
    wait_status(provider, job_id, {JobState.RUNNING})
    deadline = time.monotonic() + 20
    while not (pid_file.exists() and len(pid_file.read_text().split()) == 2):
        assert time.monotonic() < deadline, "job did not start"
        time.sleep(0.05)
    pids = [int(p) for p in pid_file.read_text().split()]
    assert provider.cancel([job_id]) == [True]
    for pid in pids:
        assert pid_gone(pid), f"pid {pid} survived qdel"
    info = pbs_emulator.wait_state(job_id, "F", timeout=20)
    assert info["Exit_status"] == 256 + 15, info  # killed by SIGTERM, as PBS Pro reports it
    assert provider.status([job_id])[0].terminal


def test_walltime_is_enforced(pbs_emulator, tmp_path):
    script = ("#!/bin/bash\n#PBS -l select=1\n#PBS -l walltime=00:00:02\n#PBS -l filesystems=home:flare\n"
              "#PBS -N wt\ntrap 'echo got-TERM; exit 143' TERM\nsleep 60 & wait\n")
    job_id = _qsub(tmp_path, script).stdout.strip()
    info = pbs_emulator.wait_state(job_id, "F", timeout=30)
    assert info["Exit_status"] == -29, info  # JOB_EXEC_KILL_WALLTIME
    seq = job_id.split(".")[0]
    assert "got-TERM" in (tmp_path / f"wt.o{seq}").read_text()
    assert "=>> PBS: job killed: walltime" in (tmp_path / f"wt.e{seq}").read_text()


def test_qsub_environment_and_options(pbs_emulator, tmp_path, monkeypatch):
    monkeypatch.setenv("CAMPAIGN_SECRET_FROM_SUBMITTER", "leaked")
    monkeypatch.setenv("PASS_ME", "yes")
    script = ("#!/bin/bash\n#PBS -l select=3:ncpus=4:mpiprocs=2\n#PBS -l walltime=00:01:00\n"
              "#PBS -l filesystems=home:flare\n#PBS -j oe\n#PBS -o out.txt\n"
              "echo secret=${CAMPAIGN_SECRET_FROM_SUBMITTER:-unset} pass=$PASS_ME x=$X cwd=$(pwd) "
              "wd=$PBS_O_WORKDIR ncpus=$NCPUS\ncat $PBS_NODEFILE\necho on-stderr >&2\nexit 3\n")
    job_id = _qsub(tmp_path, script, "-A", "acct", "-q", "debug", "-N", "envtest", "-v", "PASS_ME,X=1").stdout.strip()
    info = pbs_emulator.wait_state(job_id, "F", timeout=30)
    assert info["Exit_status"] == 3 and info["Job_Name"] == "envtest", info
    lines = (tmp_path / "out.txt").read_text().splitlines()
    assert lines[0] == (f"secret=unset pass=yes x=1 cwd={os.path.expanduser('~')} "
                        f"wd={tmp_path} ncpus=4"), lines  # no -V: submit env not inherited; job starts in $HOME
    assert lines[1:7] == ["x4000c0s0b0n0"] * 2 + ["x4000c0s1b0n0"] * 2 + ["x4000c0s2b0n0"] * 2  # mpiprocs=2
    assert lines[7] == "on-stderr"  # -j oe

    # -V exports the whole submit environment
    job_id = _qsub(tmp_path, "#!/bin/bash\n#PBS -V\n#PBS -l filesystems=home\necho secret=$CAMPAIGN_SECRET_FROM_SUBMITTER\n",
                   "-N", "vtest").stdout.strip()
    pbs_emulator.wait_state(job_id, "F", timeout=30)
    assert (tmp_path / f"vtest.o{job_id.split('.')[0]}").read_text().strip() == "secret=leaked"


def test_qsub_and_qstat_errors_like_pbs_pro(pbs_emulator, tmp_path):
    proc = _qsub(tmp_path, "#!/bin/bash\n#PBS -l select=1\necho hi\n", check=False)
    assert proc.returncode != 0 and "filesystems is required" in proc.stderr, proc
    proc = subprocess.run(["qstat", "-x", "-f", "-F", "json", "999999"], capture_output=True, text=True)
    assert proc.returncode == 153 and "Unknown Job Id" in proc.stderr
    job_id = _qsub(tmp_path, "#!/bin/bash\n#PBS -l filesystems=home:flare\ntrue\n").stdout.strip()
    pbs_emulator.wait_state(job_id, "F", timeout=30)
    proc = subprocess.run(["qstat", job_id], capture_output=True, text=True)
    assert proc.returncode == 35 and "use -x" in proc.stderr, proc  # finished jobs need -x
    short = job_id.split(".")[0]
    assert pbs_emulator.qstat(short)["job_state"] == "F"
    proc = subprocess.run(["qdel", job_id], capture_output=True, text=True)
    assert proc.returncode == 35, proc
