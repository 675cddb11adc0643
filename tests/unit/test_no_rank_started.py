"""`attempt.no_rank_started`: the reason a stage gives when no rank of its attempt ever started.

The block errors are built with Parsl's own classes and words (`SubmitException`, raised by
PBSProProvider.submit with "Submit command '...' failed", and the FAILED JobStatus message
"Failed to start block N: ..." of `parsl.executors.status_handling`), so a change of Parsl's
wording fails here rather than in a user's verdict.
"""

from __future__ import annotations

import pytest
from parsl.providers.errors import SubmitException

from campaign.attempt import AttemptReport, no_rank_started


def _submit_failure(stderr: str) -> str:
    ex = SubmitException("parsl.campaign.block-0.1", "Submit command 'qsub -q debug -A p script' failed",
                         stdout="", stderr=stderr)
    return f"Failed to start block 0: {ex}"


def _report(**kw) -> AttemptReport:
    return AttemptReport(**{"exit_code": 143, "exit_class": "block_lost", "duration_s": 0.0, "nodes": [], **kw})


@pytest.mark.parametrize("how", ["app failed (block_failed)", "job FAILED (Block.ended)"])
def test_a_missing_scheduler_command_is_named(how):
    error = _submit_failure("/bin/sh: 1: qsub: not found\n")
    if how.startswith("app"):
        rep = _report(block_failed=True, error=f"the block failed to start its worker: {error}; no launch had started")
    else:
        rep = _report(error=f"the block's scheduler job ended under the attempt: job 0 FAILED: {error}; "
                            "no launch had started")
    assert no_rank_started(rep, ranks_wrote=False) == "qsub not found on the driver's host (/bin/sh: 1: qsub: not found)"


def test_a_rejected_job_quotes_the_scheduler():
    rep = _report(block_failed=True, error=_submit_failure("qsub: Job violates queue and/or server resource limits\n"))
    assert no_rank_started(rep, ranks_wrote=False) == \
        "the job was rejected: qsub: Job violates queue and/or server resource limits"


def test_too_few_usable_nodes_and_a_launch_that_could_not_start():
    short = _report(exit_code=93, exit_class="config_error", short_of_nodes=True,
                    error="the stage asks for 2 active node(s), but the block has 0 usable of 2 (2 excluded)")
    assert no_rank_started(short, ranks_wrote=False) == short.error
    cannot = _report(exit_code=127, exit_class="crashed_systemic", nodes=["n0"],
                     error="the launch command could not start: [Errno 2] No such file or directory: 'mpiexec'")
    assert no_rank_started(cannot, ranks_wrote=False) == cannot.error
    # the trainer's own exit 127 (the contract's "broken environment": torch will not import) is a
    # rank that started; the stage calls it systemic (test_fault_matrix::test_import_failure_...)
    broken = _report(exit_code=127, exit_class="crashed_systemic", nodes=["n0"],
                     finding={"last_error_line": "campaign.train: broken environment: ImportError('libtorch_cpu.so')"})
    assert no_rank_started(broken, ranks_wrote=False) is None


def test_an_attempt_whose_ranks_ran_is_judged_as_usual():
    # a rank that started and then found a broken environment exits 127 too: it wrote, so it started
    assert no_rank_started(_report(exit_code=127, exit_class="crashed_systemic", nodes=["n0"]), ranks_wrote=True) is None
    # a block that ended under a running launch (nodes recorded) is the long run's to relaunch
    assert no_rank_started(_report(nodes=["n0", "n1"], error="the block's scheduler job ended under the attempt: "
                                                             "job 12 CANCELLED"), ranks_wrote=False) is None
    # a block whose job ended before the launch, not a failed submission: relaunched, not "no rank started"
    assert no_rank_started(_report(error="the block's scheduler job ended under the attempt: job 12 COMPLETED "
                                         "(done, or gone from the queue)"), ranks_wrote=False) is None


@pytest.mark.parametrize("line, exit_code, program", [
    # MPICH Hydra (mpiexec 4.x, Debian's mpich; seen running it here: exit 255)
    ("[proxy:0:1@vm] HYDU_create_process (utils/launch/launch.c:73): execvp error on file no-such-prog (No such file "
     "or directory)", 255, "no-such-prog"),
    # slurmstepd, as srun users report it (srun then exits 2; 13 for "Permission denied")
    ("slurmstepd: error: execve(): /lus/p/venv/bin/python: No such file or directory", 2, "/lus/p/venv/bin/python"),
    ("slurmstepd: error: execve(): train.sh: Permission denied", 13, "train.sh"),
])
def test_a_launcher_that_could_not_exec_the_program_is_named(line, exit_code, program):
    """Issue 38 item 2: the launcher ran but no rank did. tests/hpc/test_pbs_site.py runs the
    Hydra case for real through the PBS stand-in."""
    rep = _report(exit_code=exit_code, exit_class="crashed_systemic", nodes=["n0"], finding={"last_error_line": line})
    assert no_rank_started(rep, ranks_wrote=False) == \
        f"the launcher could not start {program} on the nodes (it exited {exit_code}): {line}"
    # the same line from an attempt whose ranks wrote (a rank exec'd a missing helper itself): judged as usual
    assert no_rank_started(rep, ranks_wrote=True) is None
