"""Asynchronous checkpoints (`train.checkpoint_async: true`, DCP async_save on a gloo group
of its own): resume from them is exact; a rank killed while writing one leaves it without
`.complete` and the next attempt resumes from the previous one; SIGTERM waits for the save
in flight."""

from __future__ import annotations

import pytest

from campaign import report
from train_helpers import complete_steps, save_twice_then_resume, tiny_config

pytestmark = pytest.mark.slow

ASYNC = {"checkpoint_async": True}


def test_async_save_then_resume_is_exact(launch, tmp_path, reference_30):
    first, _ = save_twice_then_resume(launch, tmp_path / "ck", ASYNC, reference_30)
    saved = [e for e in first.events() if e["event"] == "checkpoint_saved"]
    assert [e["step"] for e in saved] == [10, 20]
    assert all(e["asynchronous"] and 0 <= e["stall_s"] for e in saved)
    assert first.events()[-1]["event"] == "done"  # the final save was waited for


def test_kill_9_during_an_async_save_leaves_it_incomplete(launch, tmp_path, reference_30):
    ck = tmp_path / "ck"
    cfg = tiny_config(ck, train=ASYNC, run={"max_steps": 30, "checkpoint_at": [10, 20], "attempt": 1},
                      faults=[{"kind": "sigkill_in_checkpoint", "step": 20, "rank": 1, "attempt": 1}])
    first = launch(cfg, name="a1")
    codes = first.wait()
    assert codes[1] == -9, first.logs()
    assert codes[0] != 0
    assert (ck / report.checkpoint_name(20)).is_dir()  # begun, never completed
    assert complete_steps(ck) == [10]
    assert not (ck / report.checkpoint_name(20) / report.META_FILE).exists()

    cfg["run"]["attempt"] = 2
    second = launch(cfg, name="a2", attempt=2)
    assert second.wait() == [0, 0], second.logs()
    assert [e["step"] for e in second.events() if e["event"] == "checkpoint_loaded"] == [10]
    assert second.losses() == {s: reference_30[s] for s in range(11, 31)}
    assert complete_steps(ck)[-1] == 30


def test_sigterm_waits_for_the_save_in_flight(launch, tmp_path):
    ck = tmp_path / "ck"
    run = launch(tiny_config(ck, train={**ASYNC, "checkpoint_every": 1}, run={"max_steps": 10**6}))
    assert run.terminate_after(5) == [143, 143], run.logs()
    last = run.metrics()[-1]["step"]
    cks = report.list_checkpoints(ck)
    assert all(c["complete"] for c in cks), cks  # nothing left half-written
    assert cks[-1]["step"] == last - 1  # the step before the stop, saved in the background
    assert [e["step"] for e in run.events() if e["event"] == "checkpoint_saved"][-1] == last - 1


def test_async_save_of_fsdp2_shards_resumes_exactly(launch, tmp_path):
    fsdp = {"parallelism": "fsdp"}
    ref = launch(tiny_config(tmp_path / "ck-ref", train=fsdp, run={"max_steps": 12}), name="ref")
    assert ref.wait() == [0, 0], ref.logs()
    ck = tmp_path / "ck"
    first = launch(tiny_config(ck, train={**fsdp, **ASYNC, "checkpoint_every": 4}, run={"max_steps": 8}),
                   name="a1")
    assert first.wait() == [0, 0], first.logs()
    second = launch(tiny_config(ck, train={**fsdp, **ASYNC}, run={"max_steps": 12, "attempt": 2}), name="a2",
                    attempt=2)
    assert second.wait() == [0, 0], second.logs()
    assert second.losses() == {s: ref.losses()[s] for s in range(9, 13)}
