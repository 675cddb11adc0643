"""Fixtures for the HPC tests: a real Slurm cluster and the PBS Pro emulator.

* ``slurm_cluster`` (session): a real Slurm 22.05 cluster "campaign" (Debian's slurm-wlm)
  of 4 virtual nodes n1..n4 on this machine, started by tests/infra/slurm_cluster.sh
  (which installs the packages with apt-get when missing). SLURM_CONF is set in
  os.environ for the whole session, so sbatch/srun/squeue/scancel/scontrol and Parsl's
  SlurmProvider talk to it. If the cluster cannot start, the test fails with the reason
  (never skips). The cluster is stopped at the end unless it was already up before.
* ``pbs_emulator`` (function): puts tests/infra/pbs (qsub/qstat/qdel, a STAND-IN for PBS
  Pro) first on PATH with a fresh state directory; qdel's any job still alive at the end.

Under pytest-xdist every test of one stand-in runs on one worker (tests/conftest.py,
SHARED_STAND_INS).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from campaign.lease import process_alive

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "tests" / "infra"
SLURM_SCRIPT = INFRA / "slurm_cluster.sh"
PBS_BIN = INFRA / "pbs"
SLURM_NODES = int(os.environ.get("CAMPAIGN_SLURM_NODES", "4"))


@dataclasses.dataclass(frozen=True)
class SlurmCluster:
    nodes: list[str]
    partition: str
    conf: str
    state_dir: str
    script: str

    def run(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        """Run a Slurm client command (sinfo, srun, scontrol, ...) against this cluster."""
        env = dict(os.environ, SLURM_CONF=self.conf)
        proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=env)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} -> rc={proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}")
        return proc

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-p", self.partition, "-o", "%N %T").stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def logs(self) -> str:
        parts = []
        for p in sorted(Path(self.state_dir, "log").glob("*.log")):
            parts.append(f"----- {p} -----\n" + "\n".join(p.read_text(errors="replace").splitlines()[-40:]))
        return "\n".join(parts)


def _script(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SLURM_SCRIPT), *args], capture_output=True, text=True, timeout=timeout)



@pytest.fixture(scope="session")
def slurm_cluster():
    """A real Slurm cluster; yields a SlurmCluster (nodes, partition, conf, state_dir, run())."""
    state_dir = os.environ.get("CAMPAIGN_SLURM_DIR", "/tmp/campaign-slurm")
    conf = os.path.join(state_dir, "etc", "slurm.conf")
    # Several pytest sessions may share the one cluster of this machine: each registers
    # itself; the last one out stops the cluster, and only if a test session started it
    # (a cluster started by hand is left running).
    users = Path(state_dir, "pytest-sessions")
    started_marker = Path(state_dir, "started-by-pytest")
    was_up = _script("status", timeout=60).returncode == 0
    try:
        proc = _script("start", str(SLURM_NODES))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"slurm_cluster.sh start timed out after {e.timeout}s", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(f"the Slurm test cluster did not start (rc={proc.returncode}):\n"
                    f"{proc.stdout}\n{proc.stderr}", pytrace=False)
    if not was_up:
        started_marker.touch()
    users.mkdir(parents=True, exist_ok=True)
    me = users / str(os.getpid())
    me.touch()
    mp = pytest.MonkeyPatch()
    mp.setenv("SLURM_CONF", conf)
    try:
        yield SlurmCluster(nodes=[f"n{i}" for i in range(1, SLURM_NODES + 1)], partition="debug",
                           conf=conf, state_dir=state_dir, script=str(SLURM_SCRIPT))
    finally:
        mp.undo()
        me.unlink(missing_ok=True)
        others = [p for p in users.iterdir() if p.name.isdigit() and process_alive(int(p.name))]
        if not others and started_marker.exists():
            started_marker.unlink(missing_ok=True)
            _script("stop", timeout=120)


@dataclasses.dataclass(frozen=True)
class PBSEmulator:
    bin_dir: str
    state_dir: str

    def qstat(self, job_id: str) -> dict:
        """`qstat -x -f -F json ID` -> that job's attributes (dict)."""
        proc = subprocess.run([os.path.join(self.bin_dir, "qstat"), "-x", "-f", "-F", "json", job_id],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        jobs = json.loads(proc.stdout).get("Jobs", {})
        assert len(jobs) == 1, proc.stdout
        return next(iter(jobs.values()))

    def wait_state(self, job_id: str, states: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            info = self.qstat(job_id)
            if info["job_state"] in states:
                return info
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still {info['job_state']} after {timeout}s: {info}")
            time.sleep(0.1)


@pytest.fixture
def pbs_emulator(tmp_path, monkeypatch):
    state = tmp_path / "pbs-state"
    state.mkdir()
    monkeypatch.setenv("PATH", f"{PBS_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("PBS_EMULATOR_STATE", str(state))
    monkeypatch.setenv("PBS_EMULATOR_KILL_DELAY", "3")
    emu = PBSEmulator(bin_dir=str(PBS_BIN), state_dir=str(state))
    yield emu
    # leave nothing running: qdel every job that has not finished
    proc = subprocess.run([str(PBS_BIN / "qstat"), "-f", "-F", "json"], capture_output=True, text=True,
                          timeout=30, env=dict(os.environ))
    if proc.returncode == 0:
        live = list(json.loads(proc.stdout).get("Jobs", {}))
        if live:
            subprocess.run([str(PBS_BIN / "qdel"), "-W", "force", *live], capture_output=True, timeout=30)
