"""The real Slurm test cluster (tests/infra/slurm_cluster.sh) driven by Parsl's real
SlurmProvider and by the Slurm client commands campaign relies on."""

from __future__ import annotations

import os
import time
import uuid

import pytest
from parsl.jobs.states import JobState
from parsl.launchers import SrunLauncher
from provider_waits import pid_gone, wait_status
from parsl.providers import SlurmProvider

pytestmark = pytest.mark.slow


def _provider(tmp_path, **kw) -> SlurmProvider:
    kw.setdefault("walltime", "00:05:00")
    provider = SlurmProvider(partition="debug", nodes_per_block=2, init_blocks=0, min_blocks=0,
                             max_blocks=1, cmd_timeout=30, **kw)
    provider.script_dir = str(tmp_path)
    return provider


def test_cluster_has_all_nodes_idle(slurm_cluster):
    states = slurm_cluster.node_states()
    assert sorted(states) == sorted(slurm_cluster.nodes) == ["n1", "n2", "n3", "n4"]
    assert set(states.values()) <= {"idle", "mixed", "allocated"}, states
    # the nodes are separate slurmd daemons (the multiple-slurmd build), not one FrontEnd
    config = slurm_cluster.run("scontrol", "show", "config").stdout
    assert any(line.split()[:3] == ["MULTIPLE_SLURMD", "=", "Yes"] for line in config.splitlines()), config


def test_slurm_provider_runs_a_two_node_block(slurm_cluster, tmp_path):
    provider = _provider(tmp_path, launcher=SrunLauncher(), exclusive=True)
    marker = uuid.uuid4().hex
    # SrunLauncher pastes the command into an unquoted heredoc in the batch script, so
    # per-task variables must be escaped or they expand once, on the batch node.
    job_id = provider.submit(f"echo {marker} node=\\$SLURMD_NODENAME procid=\\$SLURM_PROCID; sleep 4",
                             tasks_per_node=1, job_name="infra-slurm")
    assert job_id and job_id.isdigit(), job_id
    seen = wait_status(provider, job_id, {JobState.RUNNING})
    assert set(seen) <= {JobState.PENDING, JobState.RUNNING}, seen
    seen = wait_status(provider, job_id, {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
    assert seen[-1] == JobState.COMPLETED, seen
    out = open(provider.resources[job_id]["job_stdout_path"]).read()
    lines = [line for line in out.splitlines() if marker in line]
    nodes = sorted(line.split("node=")[1].split()[0] for line in lines)
    assert len(nodes) == 2 and len(set(nodes)) == 2, out  # one task on each of two distinct nodes
    assert set(nodes) <= set(slurm_cluster.nodes)


def test_slurm_provider_cancel_kills_the_job(slurm_cluster, tmp_path):
    provider = _provider(tmp_path, launcher=SrunLauncher(), exclusive=False)
    pid_file = tmp_path / "pids"
    job_id = provider.submit(f"echo \\$\\$ >> {pid_file}; exec sleep 300", tasks_per_node=1, job_name="infra-cancel")
    wait_status(provider, job_id, {JobState.RUNNING})
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and len(pid_file.read_text().split()) == 2):
        assert time.monotonic() < deadline, "the job's tasks did not start"
        time.sleep(0.2)
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(set(pids)) == 2, pids  # one task per node, each its own process
    assert provider.cancel([job_id]) == [True]
    for pid in pids:
        assert pid_gone(pid), f"task pid {pid} survived scancel"
    squeue = slurm_cluster.run("squeue", "-h", "-j", job_id, "-o", "%t", check=False).stdout.strip()
    assert squeue in ("", "CA", "CG"), squeue
    assert provider.status([job_id])[0].terminal


def test_srun_exclude_never_uses_the_excluded_node(slurm_cluster):
    for n in (2, 3):
        for _ in range(3):
            out = slurm_cluster.run("srun", "-p", "debug", "-N", str(n), "--exclude=n2", "-l",
                                    "printenv", "SLURMD_NODENAME").stdout
            nodes = [line.split(":", 1)[1].strip() for line in out.splitlines() if ":" in line]
            assert len(nodes) == n and len(set(nodes)) == n, out
            assert "n2" not in nodes, out


def test_srun_nodelist_places_tasks(slurm_cluster):
    out = slurm_cluster.run("srun", "-p", "debug", "-w", "n3,n4", "-N", "2", "-l",
                            "printenv", "SLURMD_NODENAME").stdout
    assert sorted(line.split(":", 1)[1].strip() for line in out.splitlines()) == ["n3", "n4"], out


def test_scontrol_drain_and_resume(slurm_cluster):
    slurm_cluster.run("scontrol", "update", "nodename=n3", "state=drain", "reason=test")
    try:
        states = slurm_cluster.node_states()
        assert states["n3"] in ("drained", "draining"), states
        reason = slurm_cluster.run("sinfo", "-h", "-R", "-n", "n3", "-o", "%E").stdout.strip()
        assert reason == "test", reason
        # a drained node gets no work: 3 nodes out of the 3 usable ones, never n3
        out = slurm_cluster.run("srun", "-p", "debug", "-N", "3", "-l", "printenv", "SLURMD_NODENAME").stdout
        nodes = sorted(line.split(":", 1)[1].strip() for line in out.splitlines())
        assert nodes == ["n1", "n2", "n4"], out
        # and asking for it explicitly is refused at once
        proc = slurm_cluster.run("srun", "-p", "debug", "-w", "n3", "--immediate=3", "true", check=False)
        assert proc.returncode != 0, proc
    finally:
        slurm_cluster.run("scontrol", "update", "nodename=n3", "state=resume")
    deadline = time.monotonic() + 30
    while slurm_cluster.node_states()["n3"] != "idle":
        assert time.monotonic() < deadline, slurm_cluster.node_states()
        time.sleep(0.2)
    out = slurm_cluster.run("srun", "-p", "debug", "-w", "n3", "printenv", "SLURMD_NODENAME").stdout
    assert out.strip() == "n3"


def test_slurm_conf_is_exported(slurm_cluster):
    assert os.environ["SLURM_CONF"] == slurm_cluster.conf


def test_srun_keeps_the_rank_order_of_a_rotated_launch(slurm_cluster, tmp_path):
    """srun(1): "the node names will be sorted by Slurm" (--nodelist), while the arbitrary
    distribution lays tasks out "in the order of the file" SLURM_HOSTFILE names. A confirming
    retry rotates the active nodes to [n3, n1]: rank 0 (and MASTER_ADDR, hosts[0]) must be n3."""
    from campaign.executors import launchers

    plan = launchers.LaunchPlan(hosts=("n3", "n1"), ranks_per_node=2, taskfile=str(tmp_path / "srun-tasks"),
                                argv=("sh", "-c", 'echo "$SLURM_PROCID $SLURMD_NODENAME $MASTER_ADDR"'),
                                master_port=29500)
    (tmp_path / "srun-tasks").write_text("".join(f"{h}\n" for h in plan.rank_hosts))
    out = slurm_cluster.run(*launchers.build_command("srun", plan)).stdout
    placed = {int(rank): (node, master) for rank, node, master in (line.split() for line in out.splitlines())}
    assert placed == {0: ("n3", "n3"), 1: ("n3", "n3"), 2: ("n1", "n3"), 3: ("n1", "n3")}, out
