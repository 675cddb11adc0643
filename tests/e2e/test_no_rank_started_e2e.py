"""A stage in which no rank ever started says so and why (issue 38 item 2), through the real
CLI, Parsl and the local or PBS site; never "all-reduce over 0 ranks returned None".

The rejected job fakes one boundary only: `qsub` on PATH is a script that answers as PBS Pro
answers a job over the queue's limits ("qsub: Job violates queue and/or server resource
limits", exit 1); Parsl's PBSProProvider runs it as it would run the real one. The other two
shapes (a trainer program that does not exist; every node excluded) are real.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import Workspace, tiny_spec

pytestmark = pytest.mark.slow

PBS_REJECTION = "qsub: Job violates queue and/or server resource limits"


def _verdict(ws: Workspace, name: str) -> dict:
    doc = ws.status(name)
    return doc["stages"][0]


def test_a_rejected_job_is_named_as_the_reason_no_rank_started(ws: Workspace, tmp_path: Path):
    bindir = tmp_path / "pbs-bin"
    bindir.mkdir()
    (bindir / "qsub").write_text(f"#!/bin/sh\necho '{PBS_REJECTION}' >&2\nexit 1\n")
    for name in ("qstat", "qdel"):
        (bindir / name).write_text("#!/bin/sh\nexit 0\n")
    for f in bindir.iterdir():
        f.chmod(0o755)
    spec = ws.write_spec({
        "name": "rejected",
        "site": {"kind": "aurora", "account": "campaign", "queue": "debug", "nodes": 1, "walltime": "00:10:00",
                 "launcher": "mpich", "ranks_per_node": 1},
        "model": {"size": "tiny"},
        "stages": [{"kind": "smoke", "steps": 2, "timeout_s": 60}],
    })
    import os

    run = ws.cli("submit", str(spec), timeout=300, PATH=f"{bindir}:{os.environ['PATH']}")
    assert run.code == 1, run.err
    stage = _verdict(ws, "rejected")
    assert stage["state"] == "failed"
    assert stage["verdict"] == f"no rank started: the job was rejected: {PBS_REJECTION}"
    assert "0 ranks" not in run.out + run.err


def test_a_trainer_program_that_does_not_exist_starts_no_rank(ws: Workspace):
    spec = tiny_spec("no-program", [{"kind": "smoke", "steps": 2, "timeout_s": 60}], nodes=1)
    spec["trainer"] = {"command": ["no-such-trainer-program", "--steps", "{max_steps}"], "progress": "stdout",
                       "step_pattern": r"step (?P<step>\d+) loss (?P<loss>\S+)"}
    run = ws.cli("submit", str(ws.write_spec(spec)), timeout=300)
    assert run.code == 1, run.err
    stage = _verdict(ws, "no-program")
    assert stage["verdict"] == ("no rank started: the launch command could not start: [Errno 2] No such file or "
                                "directory: 'no-such-trainer-program'")
    assert stage["attempts"] == 1  # a missing program is not retried


def test_every_node_excluded_starts_no_rank_and_says_how_to_lift_it(ws: Workspace):
    for node in ("local-n0", "local-n1"):
        assert ws.cli("nodes", "exclude", node, "--site", "local", "--reason", "drill").code == 0
    run = ws.cli("submit", str(ws.write_spec(tiny_spec("all-out", [{"kind": "smoke", "steps": 2}], nodes=2))),
                 timeout=300)
    assert run.code == 1, run.err
    verdict = _verdict(ws, "all-out")["verdict"]
    assert verdict.startswith("no rank started: the stage asks for 2 active node(s), but the block has 0 usable of 2 "
                              "(2 excluded)")
    assert "campaign nodes include" in verdict
