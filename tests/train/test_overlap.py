"""Overlapped steps (`train.overlap_steps`): step N's loss is read after step N+1's forward
and backward are queued. On CPU nothing runs ahead (the device is the host), so these tests
check what the reordered host work must keep: the same losses bit for bit, a row for every
step, exact resume, and a non-finite loss or a SIGTERM still ending the run before the next
update is applied or saved. The gain (the device not waiting for the host) is measured on
CUDA in benchmarks/vs_nanogpt.py."""

from __future__ import annotations

import pytest
import torch

from campaign import report
from campaign.train.config import TrainConfig
from campaign.train.loop import overlap_steps
from train_helpers import complete_steps, save_twice_then_resume, tiny_config

OVERLAP = {"overlap_steps": True}


def test_auto_overlaps_on_cuda_without_faults_only():
    auto, cuda, cpu = TrainConfig(), torch.device("cuda", 0), torch.device("cpu")
    assert overlap_steps(auto, cuda, [])
    assert not overlap_steps(auto, cuda, [{"kind": "hang", "step": 3}])
    assert not overlap_steps(auto, cpu, [])
    assert overlap_steps(TrainConfig(overlap_steps=True), cpu, [{"kind": "hang", "step": 3}])
    assert not overlap_steps(TrainConfig(overlap_steps=False), cuda, [])


@pytest.mark.slow
def test_overlapped_steps_lose_exactly_what_sequential_ones_do(launch, tmp_path, reference_30):
    run = launch(tiny_config(tmp_path / "ck", train=OVERLAP, run={"max_steps": 30}))
    assert run.wait() == [0, 0], run.logs()
    rows = run.metrics()
    assert [r["step"] for r in rows] == list(range(1, 31))
    assert run.losses() == reference_30
    assert all(r["step_time_s"] > 0 and r["grad_norm"] > 0 and r["comm_time_s"] >= 0 for r in rows)
    start = next(e for e in run.events() if e["event"] == "start")
    assert start["overlap_steps"] is True
    assert run.events()[-1]["event"] == "done"


@pytest.mark.slow
def test_overlapped_checkpoints_resume_exactly(launch, tmp_path, reference_30):
    save_twice_then_resume(launch, tmp_path / "ck", OVERLAP, reference_30)


@pytest.mark.slow
def test_fsdp2_overlapped_matches_fsdp2_sequential(launch, tmp_path):
    """FSDP2's gradient norm is a DTensor: read when logged, not in the step's one copy; its
    sharded state is saved while the next step's backward has run, and resumes exactly."""
    fsdp = {"parallelism": "fsdp", "checkpoint_every": 4}
    seq = launch(tiny_config(tmp_path / "ck-seq", train=fsdp, run={"max_steps": 8}), name="seq")
    assert seq.wait() == [0, 0], seq.logs()
    ck = tmp_path / "ck-ovl"
    ovl = launch(tiny_config(ck, train={**fsdp, **OVERLAP}, run={"max_steps": 8}), name="ovl")
    assert ovl.wait() == [0, 0], ovl.logs()
    assert ovl.losses() == seq.losses() and len(seq.losses()) == 8
    assert [r["grad_norm"] for r in ovl.metrics()] == [r["grad_norm"] for r in seq.metrics()]
    assert complete_steps(ck) == [4, 8]
    (ck / report.checkpoint_name(8) / report.COMPLETE_MARKER).unlink()  # resume from step 4
    again = launch(tiny_config(ck, train={**fsdp, **OVERLAP}, run={"max_steps": 8, "attempt": 2}),
                   name="again", attempt=2)
    assert again.wait() == [0, 0], again.logs()
    assert [e["step"] for e in again.events() if e["event"] == "checkpoint_loaded"] == [4]
    assert again.losses() == {s: seq.losses()[s] for s in range(5, 9)}


@pytest.mark.slow
def test_a_nonfinite_loss_ends_an_overlapped_run_before_the_next_update(launch, tmp_path):
    ck = tmp_path / "ck"
    run = launch(tiny_config(ck, train={**OVERLAP, "checkpoint_every": 1}, run={"max_steps": 50},
                             faults=[{"kind": "nonfinite", "step": 5, "rank": 1}]))
    assert run.wait() == [report.EXIT_NONFINITE] * 2, run.logs()
    assert [(e["event"], e["step"]) for e in run.events()][-1] == ("nonfinite_loss", 5)
    assert max(run.losses()) == 4
    assert complete_steps(ck)[-1] == 4  # the poisoned step was never saved


@pytest.mark.slow
def test_sigterm_stops_an_overlapped_run_at_a_step_it_reported(launch, tmp_path):
    ck = tmp_path / "ck"
    run = launch(tiny_config(ck, train={**OVERLAP, "checkpoint_every": 3}, run={"max_steps": 10**6}))
    assert run.terminate_after(7) == [report.EXIT_SIGTERM] * 2, run.logs()
    last = run.metrics()[-1]["step"]
    assert [r["step"] for r in run.metrics()] == list(range(1, last + 1))
    assert all(c["complete"] for c in report.list_checkpoints(ck))
    assert complete_steps(ck)[-1] == (last - 1) // 3 * 3  # the stop's own step is not saved


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the H200)")
def test_on_cuda_overlapped_steps_lose_exactly_what_sequential_ones_do(launch, tmp_path):
    """Where the device does run ahead: each step's loss read from pinned memory after its
    event, with the next step's work queued behind it (one rank: one GPU is all we have)."""
    world = 1
    runs = {}
    for mode in (False, True):
        run = launch(tiny_config(tmp_path / f"ck-{mode}", train={"overlap_steps": mode, "deterministic": True,
                                                              "checkpoint_every": 4},
                                 run={"max_steps": 12}), name=f"overlap-{mode}", world=world)
        assert run.wait() == [0] * world, run.logs()
        runs[mode] = run
    assert next(e for e in runs[True].events() if e["event"] == "start")["overlap_steps"] is True
    assert [r["step"] for r in runs[True].metrics()] == list(range(1, 13))
    assert runs[True].losses() == runs[False].losses()
    assert ([r["grad_norm"] for r in runs[True].metrics()]
            == [r["grad_norm"] for r in runs[False].metrics()])
    assert complete_steps(tmp_path / "ck-True") == complete_steps(tmp_path / "ck-False") == [4, 8, 12]
