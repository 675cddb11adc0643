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


def test_a_failure_srun_logs_is_seen_while_srun_still_runs(tmp_path: Path) -> None:
    """srun with --kill-on-bad-exit=0 keeps the failed task's peers up (for a rescue) and logs
    the failure at once: the supervisor reads it from the growing log, a whole line at a time,
    before the launcher process exits (here a sleeping process stands in for srun)."""
    import subprocess

    from campaign.supervisor import _Launch

    log = tmp_path / "launcher.log"
    log.write_text("[rank0]: step 24\nsrun: error: n1: task 0: Terminated\n")  # a SIGTERM is no failure
    proc = subprocess.Popen(["sleep", "30"])
    try:
        launch = _Launch([(-1, "", proc)], log=log)
        assert launch.logged_failure(1.0) is None
        with open(log, "a") as f:
            f.write("srun: error: n2: task 1: Exited with exit co")  # srun is writing the line
        assert launch.logged_failure(2.0) is None
        with open(log, "a") as f:
            f.write("de 3\n[rank0]: peer lost, waiting for a rescue request\n")
        assert launch.logged_failure(3.0) == Failure(1, 3, "n2", 3.0)
        assert launch.logged_failure(4.0) == Failure(1, 3, "n2", 3.0), "the first failure stays the first"
        launch.poll(4.0)
        assert not launch.done and launch.first_failure() is None
    finally:
        proc.kill()
        proc.wait()
