"""Crash evidence from launcher output: which rank on which node failed first."""

from __future__ import annotations

from pathlib import Path

import pytest

from campaign.supervisor import Failure, launcher_failure

SRUN = """\
[rank0]: step 24
srun: error: n2: task 1: Exited with exit code 1
srun: launch/slurm: _step_signal: Terminating StepId=1.0
slurmstepd-n1: error: *** STEP 1.0 ON n1 CANCELLED AT 2026-11-29T09:03:43 ***
srun: error: n1: task 0: Terminated
"""
SRUN_KILLED = "srun: error: n3: task 2: Terminated\nsrun: error: n4: task 3: Killed\n"
PALS = "x4000c0s1b0n0: rank 13 exited with code 1\nx4000c0s0b0n0: rank 0 exited with code 143\n"
HYDRA = """\
===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   PID 551 RUNNING AT b
=   EXIT CODE: 9
=   CLEANING UP REMAINING PROCESSES
"""


@pytest.mark.parametrize(("text", "expected"), [
    (SRUN, (1, 1, "n2")),
    (SRUN_KILLED, (3, 137, "n4")),
    (PALS, (13, 1, "x4000c0s1b0n0")),
    (HYDRA, (-1, 9, "b")),
])
def test_first_failed_rank_from_the_launcher_log(tmp_path: Path, text: str, expected: tuple[int, int, str]) -> None:
    log = tmp_path / "launcher.log"
    log.write_text(text)
    rank, code, node, _ = launcher_failure(log, Failure(-1, 1, "", 0.0))
    assert (rank, code, node) == expected


def test_no_evidence_keeps_the_launcher_exit(tmp_path: Path) -> None:
    log = tmp_path / "launcher.log"
    log.write_text("training...\n")
    assert launcher_failure(log, Failure(-1, 143, "", 5.0)) == (-1, 143, "", 5.0)
    assert launcher_failure(tmp_path / "missing.log", Failure(-1, 2, "", 1.0)) == (-1, 2, "", 1.0)
