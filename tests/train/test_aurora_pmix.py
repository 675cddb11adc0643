"""The built-in trainer under the environment Aurora's `mpiexec` gives a rank: PALS in PMIx
mode, so `PMIX_RANK` and `PALS_LOCAL_RANKID` and no `PALS_SIZE`/`PMI_SIZE` (issue: a rank
exited 93, "no launcher variables give the world size"). The environment is built from the
facts quoted in docs/sites.md ("Rank variables on Aurora"), as in
tests/unit/test_placement.py::aurora_rank_env; what is faked is only the launcher: the ranks
are plain processes on this machine (gloo on CPU) and the hostfile lists one node per
virtual Aurora node, each of them this machine (MASTER_ADDR=127.0.0.1, like the `mpich`
stand-in of the aurora site)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import REPO, free_port, tiny_config

from campaign import report

RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "PALS_SIZE",
             "PALS_RANKID", "MASTER_ADDR", "MASTER_PORT")


@pytest.mark.slow
@pytest.mark.parametrize("nodes, per_node", [(1, 1), (2, 1)], ids=["1-node", "2-nodes"])
def test_the_trainer_trains_with_the_world_size_of_nodes_times_ranks_per_node(tmp_path: Path, nodes: int,
                                                                             per_node: int) -> None:
    world = nodes * per_node
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "hostfile").write_text("".join(f"x4102c5s{i}b0n0\n" for i in range(nodes)))
    config = run_dir / "trainer.json"
    config.write_text(json.dumps(tiny_config(tmp_path / "ck", run={"max_steps": 3})))
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
        env.update(PMIX_RANK=str(rank), PALS_LOCAL_RANKID=str(rank % per_node), PALS_APID="7d2c1d0e-1",
                   PMIX_NAMESPACE="pals.5120431", CAMPAIGN_HOSTFILE=str(run_dir / "hostfile"),
                   CAMPAIGN_RANKS_PER_NODE=str(per_node), CAMPAIGN_RUN_DIR=str(run_dir),
                   CAMPAIGN_NODE=f"x4102c5s{rank // per_node}b0n0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                   OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        log = open(run_dir / f"rank-{rank}.log", "w")
        procs.append(subprocess.Popen([sys.executable, "-m", "campaign.train", "--config", str(config)],
                                      env=env, stdout=log, stderr=subprocess.STDOUT))
    codes = [p.wait(timeout=180) for p in procs]
    logs = "\n".join((run_dir / f"rank-{r}.log").read_text() for r in range(world))
    assert codes == [0] * world, logs
    startup = json.loads((run_dir / report.STARTUP_FILE).read_text())
    assert startup["world_size"] == world and len(startup["ranks"]) == world
    assert startup["allreduce"]["got"] == startup["allreduce"]["expected"] == world * (world + 1) // 2
    assert [row["step"] for row in report.read_metrics(run_dir)[0]] == [1, 2, 3]
