"""The writer helpers of `campaign.report` for a trainer of your own (stdlib only): the
start-up check from the caller's own collectives, checkpoints marked complete last, the
newest complete one, and what the attempt must do (`run_config`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from campaign import report


def test_startup_check_writes_what_smoke_reads_and_says_whether_the_sum_is_exact(tmp_path: Path) -> None:
    ranks = [report.rank_identity(r, r, "cpu") for r in range(3)]
    got = sum(report.allreduce_input(r) for r in range(3))
    assert report.startup_check(ranks, got, rank=1, run_dir=tmp_path) is True
    assert report.read_startup(tmp_path) is None  # only rank 0 writes
    assert report.startup_check(ranks, got, rank=0, run_dir=tmp_path) is True
    doc = report.read_startup(tmp_path)
    assert doc is not None and doc["allreduce"] == {"got": 6.0, "expected": 6.0}
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2] and doc["world_size"] == 3
    assert report.startup_check(ranks, 5.0, rank=0, run_dir=tmp_path) is False  # a rank's value was lost


def test_a_checkpoint_is_complete_only_once_rank_0_marks_it(tmp_path: Path) -> None:
    first = report.begin_checkpoint(tmp_path, 10, rank=0)
    (first / "model.pt").write_bytes(b"x" * 7)
    report.complete_checkpoint(first, step=10, tokens=640, rank=1)  # other ranks: nothing
    assert report.latest_complete_checkpoint(tmp_path) is None
    report.complete_checkpoint(first, step=10, tokens=640, rank=0, world_size=2)
    meta = json.loads((first / report.META_FILE).read_text())
    assert (meta["step"], meta["tokens"], meta["world_size"], meta["files"]) == (10, 640, 2, {"model.pt": 7})
    second = report.begin_checkpoint(tmp_path, 20, rank=0)
    (second / "model.pt").write_bytes(b"y")  # killed before complete_checkpoint
    assert report.latest_complete_checkpoint(tmp_path) == first
    assert [(c["step"], c["complete"], c["tokens"]) for c in report.list_checkpoints(tmp_path)] == [
        (10, True, 640), (20, False, None)]
    report.begin_checkpoint(tmp_path, 10, rank=0)  # saving step 10 again: not complete until marked
    assert report.latest_complete_checkpoint(tmp_path) is None


def test_run_config_reads_the_attempts_targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CAMPAIGN_TRAINER_CONFIG", raising=False)
    assert report.run_config() is None  # not started by campaign: the script's own defaults
    cfg = tmp_path / "trainer.json"
    cfg.write_text(json.dumps({"train": {"checkpoint_every": 40}, "run": {
        "max_steps": 157, "max_tokens": 80000, "checkpoint_dir": "/c", "checkpoint_at": [], "resume": True,
        "deadline_unix": None, "attempt": 2}}))
    monkeypatch.setenv("CAMPAIGN_TRAINER_CONFIG", str(cfg))
    run = report.run_config()
    assert run is not None and (run["max_steps"], run["checkpoint_every"], run["resume"]) == (157, 40, True)
