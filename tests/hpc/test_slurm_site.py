"""The `slurm` site end to end on the real Slurm test cluster (fixture `slurm_cluster`):
`campaign submit` -> Parsl's SlurmProvider (one sbatch block, one worker on its head node)
-> the supervisor reads SLURM_JOB_NODELIST -> `srun --nodelist/--exclude` puts one rank on
each virtual node, and every rank names its node from SLURMD_NODENAME."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CAMPAIGN = [sys.executable, "-m", "campaign.cli"]


def _campaign(tmp_path: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "CAMPAIGN_WORKDIR": str(tmp_path / "wd")}
    env.pop("CAMPAIGN_DB_URL", None)
    return subprocess.run([*CAMPAIGN, *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=timeout)


def _rank_nodes(run_dir: Path) -> list[str]:
    ranks = json.loads((run_dir / "startup.json").read_text())["ranks"]
    rows = ranks.values() if isinstance(ranks, dict) else ranks
    return [r["node"] for r in sorted(rows, key=lambda r: r["rank"])]


def _no_jobs_left(slurm_cluster) -> None:
    out = slurm_cluster.run("squeue", "-h", "-o", "%i %j %T").stdout
    assert "parsl.campaign" not in out, out


def test_campaign_runs_smoke_loss_check_and_scaling_through_srun(slurm_cluster, tmp_path):
    spec = tmp_path / "slurm.yaml"
    shutil.copy(REPO / "examples" / "slurm-cluster.yaml", spec)
    proc = _campaign(tmp_path, "submit", str(spec))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    camp = tmp_path / "wd" / "slurm-demo"
    assert _rank_nodes(camp / "smoke" / "attempt-001") == ["n1", "n2", "n3", "n4"]
    for number, nodes in ((1, ["n1"]), (2, ["n1", "n2"]), (3, ["n1", "n2", "n3", "n4"])):
        run_dir = camp / "scaling" / f"attempt-{number:03d}"
        rep = json.loads((run_dir / "supervisor.json").read_text())
        # srun lays the ranks out in the order of the attempt's task file (SLURM_HOSTFILE)
        assert rep["launch_command"][:3] == ["env", f"SLURM_HOSTFILE={run_dir / 'srun-tasks'}", "srun"], rep
        assert (run_dir / "srun-tasks").read_text().split() == nodes
        assert _rank_nodes(run_dir) == nodes
    # the block was one sbatch job of 4 nodes, submitted by Parsl's SlurmProvider
    scripts = list((camp / "parsl").glob("*/submit_scripts/parsl.campaign.block-0.*[0-9]"))
    assert len(scripts) == 1, scripts
    assert "#SBATCH --nodes=4" in scripts[0].read_text()
    status = json.loads(_campaign(tmp_path, "status", "slurm-demo", "--json").stdout)
    assert status["state"] == "succeeded", status
    _no_jobs_left(slurm_cluster)


def _exclusion_spec(tmp_path: Path, name: str) -> Path:
    data = yaml.safe_load((REPO / "examples" / "slurm-cluster.yaml").read_text())
    data["name"] = name
    data["site"].update(nodes=3, spares=1, walltime="00:10:00")
    data["stages"] = [{"name": "smoke", "kind": "smoke", "steps": 2, "timeout_s": 180}]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_excluded_node_gets_no_rank_and_too_few_nodes_is_refused(slurm_cluster, tmp_path):
    proc = _campaign(tmp_path, "nodes", "exclude", "n2", "--site", "slurm", "--reason", "test")
    assert proc.returncode == 0, proc.stderr
    proc = _campaign(tmp_path, "submit", str(_exclusion_spec(tmp_path, "slurm-exclude")))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    run_dir = tmp_path / "wd" / "slurm-exclude" / "smoke" / "attempt-001"
    rep = json.loads((run_dir / "supervisor.json").read_text())
    assert rep["allocation"] == ["n1", "n2", "n3", "n4"] and rep["nodes"] == ["n1", "n3", "n4"], rep
    assert "--exclude=n2" in rep["launch_command"], rep["launch_command"]
    assert _rank_nodes(run_dir) == ["n1", "n3", "n4"]  # SLURMD_NODENAME of each rank: never n2

    # two nodes excluded: 2 usable of 4, the stage asks for 3 -> refused, not retried (93)
    proc = _campaign(tmp_path, "nodes", "exclude", "n3", "--site", "slurm", "--reason", "test")
    assert proc.returncode == 0, proc.stderr
    proc = _campaign(tmp_path, "submit", str(_exclusion_spec(tmp_path, "slurm-too-few")))
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    rep = json.loads((tmp_path / "wd" / "slurm-too-few" / "smoke" / "attempt-001" / "supervisor.json").read_text())
    assert rep["exit_code"] == 93 and rep["exit_class"] == "config_error", rep
    assert "asks for 3 active node(s), but the block has 2 usable of 4" in rep["error"]
    _no_jobs_left(slurm_cluster)
