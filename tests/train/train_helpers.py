"""Helpers of the trainer tests: launch the built-in trainer as N local processes, as the supervisor does.

Each rank gets RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE, a hostfile of 127.0.0.1
lines with CAMPAIGN_MASTER_PORT (a free port), CAMPAIGN_RUN_DIR, CAMPAIGN_NODE, a short
heartbeat interval and a short SIGTERM grace. PYTHONPATH carries the repository root, so
the tests work with or without `pip install -e`.

Ranks start as the local site starts them: through the node's fork server
(campaign.executors.warm, `trainer.warm_start: auto`), its scope and lifetime this pytest
process's (`warm.launch_environment()`, as the supervisor sets them). A rank then costs a
fork, not an interpreter start and torch's import (~2 s of CPU here). The cold start, as
srun and mpiexec give it, is tested in tests/hpc and tests/train/test_aurora_pmix.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from campaign import report  # noqa: E402
from campaign.executors import warm  # noqa: E402


def complete_steps(checkpoint_dir: Path) -> list[int]:
    """Steps of the complete checkpoints under `checkpoint_dir`, oldest first."""
    return [c["step"] for c in report.list_checkpoints(checkpoint_dir) if c["complete"]]


def save_twice_then_resume(launch, checkpoint_dir: Path, train: dict, reference_30: dict[int, float]):
    """20 steps saving every 10, then attempt 2 to step 30 under the same `train` settings:
    checks that it resumed from step 20 and trained steps 21-30 as the uninterrupted
    reference did. Returns both launches."""
    first = launch(tiny_config(checkpoint_dir, train={**train, "checkpoint_every": 10}, run={"max_steps": 20}),
                   name="a1")
    assert first.wait() == [0, 0], first.logs()
    assert complete_steps(checkpoint_dir) == [10, 20]
    second = launch(tiny_config(checkpoint_dir, train=train, run={"max_steps": 30, "attempt": 2}), name="a2",
                    attempt=2)
    assert second.wait() == [0, 0], second.logs()
    assert [e["step"] for e in second.events() if e["event"] == "checkpoint_loaded"] == [20]
    assert second.losses() == {s: reference_30[s] for s in range(21, 31)}
    return first, second


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_config(checkpoint_dir: Path, **sections) -> dict:
    """A tiny deterministic TrainerConfig as a dict; `sections` update model/train/run/..."""
    cfg: dict = {"model": {"size": "tiny"}, "data": {}, "train": {},
                 "run": {"max_steps": 5, "checkpoint_dir": str(checkpoint_dir)}, "faults": []}
    for key, value in sections.items():
        if isinstance(value, dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    return cfg


class Launch:
    """The ranks of one attempt."""

    def __init__(self, procs: list[subprocess.Popen], run_dir: Path, nodes: list[str] = (), attempt: int = 1) -> None:
        self.procs, self.run_dir = procs, run_dir
        self.nodes, self.attempt = list(dict.fromkeys(nodes)), attempt

    def wait(self, timeout: float = 120, kill_after_failure: float = 30) -> list[int]:
        """Wait for every rank; once one fails, give the others `kill_after_failure` s."""
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in self.procs):
            failed = any(p.poll() not in (None, 0) for p in self.procs)
            if failed:
                deadline = min(deadline, time.monotonic() + kill_after_failure)
            if time.monotonic() > deadline:
                self.kill()
                break
            time.sleep(0.05)
        return [p.wait() for p in self.procs]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()

    def send(self, rank: int, sig: int = signal.SIGTERM) -> None:
        self.procs[rank].send_signal(sig)

    def metrics(self) -> list[dict]:
        return report.read_metrics(self.run_dir)[0]

    def wait_for_step(self, step: int, timeout: float = 120) -> None:
        """Until rank 0 has reported `step`; fails if a rank exits first or time runs out."""
        deadline = time.monotonic() + timeout
        while not self.metrics() or self.metrics()[-1]["step"] < step:
            assert time.monotonic() < deadline and all(p.poll() is None for p in self.procs), self.logs()
            time.sleep(0.05)

    def terminate_after(self, step: int) -> list[int]:
        """Once rank 0 has reported `step`, SIGTERM every rank; their exit codes."""
        self.wait_for_step(step)
        for rank in range(len(self.procs)):
            self.send(rank, signal.SIGTERM)
        return self.wait()

    def losses(self) -> dict[int, float]:
        return {row["step"]: row["loss"] for row in self.metrics()}

    def events(self) -> list[dict]:
        return report.read_events(self.run_dir)

    def logs(self) -> str:
        return "\n".join(f"--- rank {i} ---\n" + (self.run_dir / f"rank-{i}.log").read_text()
                         for i in range(len(self.procs)))


class Launcher:
    """launcher(cfg, world=2, name="run", nodes=None, env=None, attempt=1) -> Launch."""

    def __init__(self, base: Path) -> None:
        self.base, self.started = base, []

    def __call__(self, cfg: dict, world: int = 2, name: str = "run",
                 nodes: list[str] | None = None, env: dict[str, str | None] | None = None,
                 attempt: int = 1) -> Launch:
        run_dir = self.base / name
        run_dir.mkdir()
        cfg_path = run_dir / "config.json"
        cfg_path.write_text(json.dumps(cfg))
        nodes = nodes or ["local-n0"] * world
        hostfile = run_dir / "hostfile"
        hostfile.write_text("".join("127.0.0.1\n" for _ in dict.fromkeys(nodes)))
        port = str(free_port())
        procs = []
        for rank in range(world):
            same_node = [r for r in range(world) if nodes[r] == nodes[rank]]
            e = {k: v for k, v in os.environ.items()
                 if k not in ("MASTER_ADDR", "MASTER_PORT", "CAMPAIGN_ALLOW_FAULTS")}
            e.update(RANK=str(rank), WORLD_SIZE=str(world),
                     LOCAL_RANK=str(same_node.index(rank)), LOCAL_WORLD_SIZE=str(len(same_node)),
                     CAMPAIGN_RUN_DIR=str(run_dir), CAMPAIGN_NODE=nodes[rank],
                     CAMPAIGN_HOSTFILE=str(hostfile), CAMPAIGN_MASTER_PORT=port,
                     CAMPAIGN_ATTEMPT=str(attempt), CAMPAIGN_HEARTBEAT_INTERVAL="0.2",
                     CAMPAIGN_SIGTERM_GRACE="3", CAMPAIGN_ALLOW_FAULTS="1",
                     OMP_NUM_THREADS="1",
                     PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
            e.update(warm.launch_environment())
            e.update(env or {})
            e = {k: v for k, v in e.items() if v is not None}
            with open(run_dir / f"rank-{rank}.log", "w") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "campaign.executors.warm", "--",
                     sys.executable, "-m", "campaign.train", "--config", str(cfg_path)],
                    cwd=self.base, env=e, stdout=log, stderr=subprocess.STDOUT))
        self.started.append(Launch(procs, run_dir, nodes, attempt))
        return self.started[-1]

    def close(self) -> None:
        for launch_ in self.started:
            launch_.kill()
            for p in launch_.procs:
                p.wait()
            # A rank these tests killed leaves its node-local state (/dev/shm/campaign-*),
            # as on a real node; the supervisor removes it after an attempt, so do we.
            for node in launch_.nodes:
                report.remove_node_local(launch_.run_dir, node, str(launch_.attempt))


