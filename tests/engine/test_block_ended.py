"""`Block.ended()`: the block's scheduler job over, read from Parsl's provider status.

The boundary faked here is the executor's `status()` (what Parsl's provider answers from
squeue/sacct/qstat: block id -> JobStatus) and its block -> job id map; the real Slurm path
is tests/hpc/test_slurm_faults.py::test_block_cancelled_and_node_drained_under_a_running_long_run.
"""

from __future__ import annotations

from pathlib import Path

from parsl.jobs.states import JobState, JobStatus

from campaign.block import JOB_POLL_S, Block
from campaign.executors.base import LABEL
from campaign.executors.local import LocalSite


class FakeExecutor:
    def __init__(self) -> None:
        self.states: dict[str, JobStatus] = {}
        self.blocks_to_job_id = {"0": "4242"}
        self.calls = 0
        self.fail = False

    def status(self) -> dict[str, JobStatus]:
        self.calls += 1
        if self.fail:
            raise RuntimeError("squeue: error: slurm_load_jobs error: Socket timed out")
        return dict(self.states)


class FakeDFK:
    def __init__(self, executor: FakeExecutor) -> None:
        self.executors = {LABEL: executor}


def block_with(tmp_path: Path) -> tuple[Block, FakeExecutor]:
    b = Block(LocalSite(), tmp_path, record=lambda kind, message, data: None)
    exe = FakeExecutor()
    b._dfk = FakeDFK(exe)
    return b, exe


def test_a_running_or_pending_block_is_not_over(tmp_path) -> None:
    b, exe = block_with(tmp_path)
    assert b.ended(now=100.0) is None, "no block submitted yet: nothing to say"
    exe.states = {"0": JobStatus(JobState.PENDING)}
    assert b.ended(now=200.0) is None
    exe.states = {"0": JobStatus(JobState.RUNNING)}
    assert b.ended(now=300.0) is None


def test_a_cancelled_block_is_over_and_named_by_its_job_id(tmp_path) -> None:
    b, exe = block_with(tmp_path)
    exe.states = {"0": JobStatus(JobState.CANCELLED, "scancel by root")}
    why = b.ended(now=100.0)
    assert why is not None and "job 4242 CANCELLED" in why and "scancel by root" in why
    exe.states = {"0": JobStatus(JobState.COMPLETED)}  # squeue no longer lists it: Parsl reads COMPLETED
    assert "job 4242 COMPLETED (done, or gone from the queue)" in (b.ended(now=200.0) or "")


def test_one_live_block_of_two_keeps_the_attempt(tmp_path) -> None:
    """Parsl's strategy may already have asked for a new block: not every block is over."""
    b, exe = block_with(tmp_path)
    exe.states = {"0": JobStatus(JobState.CANCELLED), "1": JobStatus(JobState.PENDING)}
    assert b.ended(now=100.0) is None


def test_the_provider_is_asked_at_most_every_poll_period(tmp_path) -> None:
    b, exe = block_with(tmp_path)
    exe.states = {"0": JobStatus(JobState.RUNNING)}
    for t in (100.0, 100.5, 100.0 + JOB_POLL_S / 2):
        b.ended(now=t)
    assert exe.calls == 1, "one squeue per JOB_POLL_S, not one per driver tick"
    b.ended(now=100.0 + JOB_POLL_S)
    assert exe.calls == 2


def test_a_provider_that_cannot_answer_is_not_a_lost_block(tmp_path) -> None:
    b, exe = block_with(tmp_path)
    exe.fail = True
    assert b.ended(now=100.0) is None
    exe.fail, exe.states = False, {"0": JobStatus(JobState.FAILED)}
    assert b.ended(now=100.0 + JOB_POLL_S) is not None


def test_nothing_loaded_nothing_asked(tmp_path) -> None:
    b = Block(LocalSite(), tmp_path, record=lambda kind, message, data: None)
    assert b.ended(now=100.0) is None
