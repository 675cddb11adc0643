"""campaign.report: writers and readers of the trainer contract (no torch)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from campaign import report
from train_helpers import REPO


def test_read_metrics_tolerates_a_partial_last_line(tmp_path):
    path = tmp_path / report.METRICS_FILE
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
    rows, offset = report.read_metrics(tmp_path)
    assert rows == [{"step": 1, "loss": 2.0}]
    with open(path, "a") as f:
        f.write('ss": 1.5}\n')
    rows, offset2 = report.read_metrics(tmp_path, offset)
    assert rows == [{"step": 2, "loss": 1.5}]
    assert report.read_metrics(tmp_path, offset2) == ([], offset2)


def test_readers_on_an_empty_run_dir(tmp_path):
    assert report.read_metrics(tmp_path) == ([], 0)
    assert report.read_events(tmp_path) == []
    assert report.read_heartbeats(tmp_path) == {}
    assert report.read_startup(tmp_path) is None
    assert report.list_checkpoints(tmp_path / "nope") == []


def test_reporter_writes_metrics_events_heartbeats(tmp_path, monkeypatch):
    monkeypatch.setenv("CAMPAIGN_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("CAMPAIGN_NODE", "n7")
    monkeypatch.setenv("CAMPAIGN_ATTEMPT", f"test-{time.time()}")
    monkeypatch.setenv("CAMPAIGN_HEARTBEAT_INTERVAL", "0.05")
    rep = report.Reporter.from_env(rank=0, local_rank=0, world_size=1)
    rep.event("start", 0)
    rep.phase("compute", 1)
    rep.step(step=1, tokens=10, loss=3.5, step_time_s=0.1, lr=1e-3)
    time.sleep(0.2)
    hb = report.read_heartbeats(tmp_path)["n7"]
    assert hb["ranks"]["0"]["phase"] == "compute" and hb["ranks"]["0"]["step"] == 1
    rep.close()
    assert report.read_heartbeats(tmp_path)["n7"]["ranks"]["0"]["phase"] == "done"
    (row,), _ = report.read_metrics(tmp_path)
    assert row["loss"] == 3.5 and row["tokens"] == 10 and "time" in row
    assert report.read_events(tmp_path)[0]["event"] == "start"
    assert list((tmp_path / "heartbeats").iterdir()) == [tmp_path / "heartbeats" / "n7.json"]


def test_other_ranks_write_nothing_to_the_run_dir(tmp_path):
    rep = report.Reporter(tmp_path, rank=1, local_rank=1, world_size=2, node="x",
                          attempt=f"t{time.time()}", interval=10)
    rep.step(step=1, tokens=1, loss=1.0, step_time_s=1.0)
    rep.event("done", 1)
    rep.close()
    assert report.read_metrics(tmp_path) == ([], 0)
    assert report.read_events(tmp_path) == []
    assert report.read_heartbeats(tmp_path) == {}


def test_list_checkpoints(tmp_path):
    for step, complete in ((10, True), (20, False)):
        d = tmp_path / report.checkpoint_name(step)
        d.mkdir()
        (d / report.META_FILE).write_text(json.dumps({"step": step, "tokens": step * 100}))
        if complete:
            (d / report.COMPLETE_MARKER).write_text("")
    cks = report.list_checkpoints(tmp_path)
    assert [(c["step"], c["tokens"], c["complete"]) for c in cks] == [(10, 1000, True),
                                                                      (20, 2000, False)]
    assert cks[0]["path"].endswith("step-00000010")


def test_report_and_train_package_import_no_torch():
    code = ("import sys, campaign.report, campaign.train, campaign.train.config; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
