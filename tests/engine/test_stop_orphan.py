"""Stopping a launch its supervisor no longer watches (issue 39 item 1): on a host this driver
cannot reach, it relaunches only once the launch's guard (a real `python -m campaign.guard`
process) says the old ranks are gone, and refuses, naming the host and the process groups,
while something still writes there. "Another host" is the `host` that pids.json records (a
name that is not this machine's): the one boundary faked here; the ranks stand-ins are real
processes in process groups of their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from campaign import guard, recovery
from campaign.executors.local import LocalSite
from campaign.rundir import LAUNCH_GONE, LOGS_DIR, METRICS_FILE, PIDS_FILE, STOP_FILE

WRITER = "import sys, time\nwhile True:\n    open(sys.argv[1], 'a').write('{}\\n'); time.sleep(0.2)\n"
"""A rank stand-in: appends a line to metrics.jsonl every 0.2 s, forever."""


def _rank(run_dir: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(run_dir / METRICS_FILE)], cwd=run_dir,
                            start_new_session=True)


def _run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "c" / "long" / "attempt-001"
    (run_dir / LOGS_DIR).mkdir(parents=True)
    return run_dir


def test_a_launch_on_another_host_is_stopped_by_its_guard_before_stop_orphan_returns(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    rank = _rank(run_dir)
    watcher = guard.start(run_dir, [rank.pid])
    (run_dir / PIDS_FILE).write_text(json.dumps({"host": "login-9", "pgids": [rank.pid], "attempt": 1}))
    try:
        t0 = time.monotonic()
        said = recovery.stop_orphan(run_dir, LocalSite(), confirm_s=30)
        took = time.monotonic() - t0
        assert rank.poll() is not None, "the rank was gone when stop_orphan returned"
        assert said.startswith("stopped by its guard after the STOP file"), said
        assert took < guard.TERM_GRACE_S + 5, took
        assert json.loads((run_dir / LAUNCH_GONE).read_text())["pgids"] == [rank.pid]
        assert watcher.wait(timeout=10) == 0
    finally:
        for p in (rank, watcher):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_live_launch_on_another_host_without_a_guard_is_refused_naming_it(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """No guard answers (its host is unreachable) and the files still change: refused, naming
    the host and the groups; once they stop changing (killed by hand there), taken for gone."""
    monkeypatch.setattr(recovery, "SILENT_S", 1.5)
    run_dir = _run_dir(tmp_path)
    rank = _rank(run_dir)
    (run_dir / PIDS_FILE).write_text(json.dumps({"host": "login-9", "pgids": [rank.pid], "attempt": 1}))
    try:
        with pytest.raises(recovery.LaunchStillRunning, match=rf"may still train on login-9 \(process groups "
                                                              rf"{rank.pid}\).*kill -9 -- -{rank.pid}"):
            recovery.stop_orphan(run_dir, LocalSite(), confirm_s=3)
        assert rank.poll() is None, "this driver cannot reach login-9: it killed nothing"
    finally:
        rank.kill()
        rank.wait()
    said = recovery.stop_orphan(run_dir, LocalSite(), confirm_s=3)
    assert "did not confirm it stopped, but wrote nothing for" in said, said


def test_no_launch_starts_after_stop_orphan_found_none(tmp_path: Path) -> None:
    """The supervisor records that a launch may start (pids.json) before it looks for STOP: a
    driver that wrote STOP and found no pids.json can relaunch at once."""
    run_dir = _run_dir(tmp_path)
    assert recovery.stop_orphan(run_dir, LocalSite(), confirm_s=1) == "no launch had started"
    assert (run_dir / STOP_FILE).exists()


def test_the_guard_exits_with_its_launch_and_leaves_the_proof(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"], cwd=run_dir,
                            start_new_session=True)
    watcher = guard.start(run_dir, [rank.pid])
    rank.wait()
    assert watcher.wait(timeout=15) == 0
    gone = json.loads((run_dir / LAUNCH_GONE).read_text())
    assert gone["how"] == "exited" and gone["pgids"] == [rank.pid] and gone["host"] == os.uname().nodename
