"""The rescue's device-side guard on a real CUDA device (skipped without one; run on the H200
with `pytest tests/train/test_rescue_cuda.py`).

Stand-in, named: a spinning kernel (`torch.cuda._sleep`) on the compute stream stands in for
a collective that never finishes (a peer that hangs); the optimizer's kernels are queued
behind it, as the training loop queues them before it learns that the collective is stuck.
What is real: the stream, the event, the copies, the DCP save and the GIL while the host
waits for the device."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from campaign.train import rescue  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SPIN = int(3e9)
"""Clock cycles the stand-in collective spins: ~1.5-2 s on an H100/H200."""


def _setup(tmp_path: Path):
    model = torch.nn.Linear(256, 256, device="cuda")
    optim = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(8, 256, device="cuda")).sum().backward()
    optim.step()  # step 1, finished (the loop synchronizes after every step)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda e: 1.0)
    torch.cuda.synchronize()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / rescue.REQUEST_FILE).write_text(json.dumps({"rank": 0}))
    res = rescue.Rescue(run_dir=str(run_dir), checkpoint_dir=str(tmp_path / "ck"), rank=0, world_size=2,
                        keep_last=2, state=lambda: (model, optim, sched), cuda=True)
    res.mark(1, 100, 1)
    model(torch.ones(8, 256, device="cuda")).sum().backward()  # step 2's gradients
    return model, optim, sched, res, run_dir


def _answer(res: rescue.Rescue, run_dir: Path) -> dict:
    res._answer()
    return json.loads((run_dir / rescue.RESULT_FILE).read_text())


def test_the_replica_of_the_finished_step_is_saved_while_the_stream_is_stuck(tmp_path):
    model, optim, _, res, run_dir = _setup(tmp_path)
    before = model.weight.detach().cpu().clone()
    torch.cuda._sleep(SPIN)  # the hung collective
    res.updating()
    optim.step()  # queued behind it: has not run
    got = _answer(res, run_dir)
    assert got["saved"] and got["step"] == 1, got
    torch.cuda.synchronize()
    assert not torch.equal(model.weight.detach().cpu(), before), "the optimizer did run afterwards"

    import warnings

    import torch.distributed.checkpoint as dcp

    saved = {"model": {"weight": torch.empty(256, 256), "bias": torch.empty(256)}}
    with warnings.catch_warnings():  # DCP's "assuming the intent is to load in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(saved, checkpoint_id=got["path"], no_dist=True)
    assert torch.equal(saved["model"]["weight"], before), "the saved weights are step 1's, not step 2's"


def test_a_save_outlived_by_the_guard_is_discarded(tmp_path):
    model, optim, sched, res, run_dir = _setup(tmp_path)

    def slow_state():  # the read takes longer than the "collective": step 2's update may land in it
        torch.cuda.synchronize()
        return model, optim, sched

    res._state = slow_state
    torch.cuda._sleep(int(1e8))  # ~50 ms: pending when the save starts, over before it ends
    res.updating()
    optim.step()
    got = _answer(res, run_dir)
    assert not got["saved"] and "discarded" in got["why"], got
    assert not any((tmp_path / "ck").glob("step-*")), "nothing a resume could pick up"


def test_the_event_passed_before_the_request_means_mid_update(tmp_path):
    _, optim, _, res, run_dir = _setup(tmp_path)
    res.updating()
    optim.step()
    torch.cuda.synchronize()
    got = _answer(res, run_dir)
    assert not got["saved"] and "mid optimizer step" in got["why"], got


def test_the_rescue_thread_runs_while_the_host_waits_for_the_stuck_stream(tmp_path):
    """The training thread blocks in a device read behind the stuck stream: the rescue thread
    must still get the interpreter (the wait releases it) and finish first."""
    model, optim, _, res, run_dir = _setup(tmp_path)
    torch.cuda._sleep(SPIN)
    res.updating()
    optim.step()
    loss = model.weight.sum()
    res.on_signal()
    loss.item()  # blocks until the spin and the optimizer are done
    result = run_dir / rescue.RESULT_FILE
    end = time.monotonic() + 30
    while not result.exists() and time.monotonic() < end:  # the write to disk may go on after
        time.sleep(0.05)
    # Saved (not discarded) means the copy was taken before the optimizer's event passed:
    # while this thread was blocked in the read.
    got = json.loads(result.read_text())
    assert got["saved"] and got["step"] == 1, got
    assert not [t for t in threading.enumerate() if t.name == "campaign-rescue" and t.is_alive()]
