"""A take-over stops the old launch (issue 39, item 1): two launches of one stage never train
at the same time. Real processes throughout: the CLI drivers, Parsl HTEX on the local site,
gloo ranks on virtual nodes, a real SQLite ledger.

"Another host" is a real UTS namespace (`unshare --uts`) whose host name differs: the new
driver's `socket.gethostname()` is not the launch's, so it cannot kill the old ranks by their
process groups and must rely on what the old launch's host does with the STOP file. That is
the one boundary faked here (the processes still share one PID namespace, which the driver
never uses across hosts)."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e_helpers import Workspace, ledger_view, tiny_spec
from test_driver_faults import finish, long_run, processes_naming, trainers_of, wait_for_steps

pytestmark = pytest.mark.slow

STEPS = 300
SLOW = {"kind": "slow", "step": 1, "delay_s": 0.1}
"""At least 0.1 s a step: the old ranks would train on for half a minute beside the new ones."""


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _on_another_host(ws: Workspace, host: str, *args: str, **env: str) -> subprocess.Popen[str]:
    """The CLI as a driver on host `host` would run it (same work directory, same ledger)."""
    cmd = ["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$0" "$@"', sys.executable, "-m", "campaign.cli",
           *args]
    return subprocess.Popen(cmd, cwd=ws.root, env=ws.env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _lease_host(ws: Workspace) -> str | None:
    from campaign.ledger.models import Lease

    ledger = ws.ledger()
    try:
        with ledger.session() as s:
            row = s.query(Lease).one_or_none()
            return None if row is None else row.host
    finally:
        ledger.close()


def _age_lease(ws: Workspace, seconds: float) -> None:
    """As if the holder had not renewed its lease for `seconds` (it is stopped: nothing renews it)."""
    from campaign.ledger.models import Lease

    ledger = ws.ledger()
    try:
        with ledger.session() as s:
            row = s.query(Lease).one()
            row.renewed = row.renewed - dt.timedelta(seconds=seconds)
    finally:
        ledger.close()


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0,
                    reason="a UTS namespace (another host name) needs unshare and root (CI runs as root)")
def test_a_take_over_from_another_host_stops_the_old_launch_before_relaunching(ws: Workspace) -> None:
    """The old driver hangs (SIGSTOP) and its block's worker, which ran the supervisor, is gone
    (as when a displaced driver unloads Parsl): its ranks train on and nobody on their host
    reads the STOP file. A driver on another host takes the stale lease over with `resume`.
    Before: it wrote STOP and relaunched at once; the old ranks trained on beside the new
    attempt into the same checkpoint folder. Now the launch's guard honours STOP, the new
    driver relaunches only once the guard says the old ranks are gone, and the old driver,
    woken up, finds itself fenced and stops with one line."""
    spec = ws.write_spec(tiny_spec("takeover", [long_run(steps=STEPS, checkpoint_every=10, faults=[SLOW],
                                                         max_attempts=3)]))
    old = ws.popen("submit", str(spec), CAMPAIGN_ALLOW_FAULTS="1")
    first = ws.workdir / "takeover" / "long" / "attempt-001"
    second = ws.workdir / "takeover" / "long" / "attempt-002"
    wait_for_steps(first / "metrics.jsonl", 15)
    pids = json.loads((first / "pids.json").read_text())
    os.kill(old.pid, signal.SIGSTOP)  # the old driver hangs: its lease is no longer renewed
    os.kill(_parent(pids["pgids"][0]), signal.SIGKILL)  # its supervisor's worker is gone; the ranks train on
    _age_lease(ws, 120)
    new = _on_another_host(ws, "login-2", "resume", "takeover", CAMPAIGN_ALLOW_FAULTS="1")
    try:
        deadline = time.time() + 120
        while _lease_host(ws) != "login-2":
            assert time.time() < deadline and new.poll() is None, "the driver on login-2 did not take the lease over"
            time.sleep(0.2)
        os.kill(old.pid, signal.SIGCONT)  # the old driver wakes up displaced
        old_out = finish(old, 120, "the displaced driver did not stop")
        out = finish(new, 400, "the resume on login-2 hung")
    finally:
        for p in (old, new):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert new.returncode == 0, out
    assert old.returncode == 2 and "Traceback" not in old_out and "lease" in old_out, old_out
    assert "Traceback" not in out, out
    rows1, rows2 = _rows(first / "metrics.jsonl"), _rows(second / "metrics.jsonl")
    gone = json.loads((first / "launch-gone.json").read_text())
    assert gone["how"] == "stopped", gone
    assert rows2, "the relaunch trained"
    assert rows1[-1]["time"] < rows2[0]["time"], "the old launch's last step came before the new one's first"
    assert gone["time"] < rows2[0]["time"], "the old ranks were gone before the new attempt's first step"
    assert trainers_of(first) == [] and trainers_of(second) == [], "no rank of either launch survives"
    view = ledger_view(ws, "takeover")
    assert view["stage"] == "passed", view["verdict"]
    assert view["attempts"][0]["state"] == "orphaned" and "guard" in view["attempts"][0]["summary"]["recovery"]
    assert any(k == "attempt_orphaned" and "whose lease this driver took over" in m for k, m in view["events"])
    ledger_steps = {s for a in view["attempts"] for s, _ in a["steps"]}
    written = {r["step"] for r in rows1 + rows2}
    assert written <= ledger_steps and ledger_steps == set(range(1, STEPS + 1)), "rows lost"
    assert view["exclusions"] == [], "a take-over is no node's fault"
    from campaign.report import _node_local_dir

    left = [d for i in (1, 2) for node in ("local-n0", "local-n1", "local-n2")
            if (d := _node_local_dir(str(ws.workdir / "takeover" / "long" / f"attempt-{i:03d}"), node, str(i))).exists()]
    assert left == [], f"node-local state left in /dev/shm: {left}"


def test_cancel_after_the_driver_died_stops_its_ranks_and_records_cancelled(ws: Workspace) -> None:
    """Before: "the driver is gone; campaign resume recovers it" while the ranks trained on, and a
    user who wanted the allocation back had only `resume` (which trains on) or kill by hand."""
    spec = ws.write_spec(tiny_spec("cancelgone", [long_run(steps=STEPS, checkpoint_every=10, faults=[SLOW])]))
    p = ws.popen("submit", str(spec), CAMPAIGN_ALLOW_FAULTS="1")
    first = ws.workdir / "cancelgone" / "long" / "attempt-001"
    wait_for_steps(first / "metrics.jsonl", 10)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    r = ws.cli("cancel", "cancelgone")
    assert r.code == 0 and r.out.strip().endswith("cancelgone: cancelled"), r.out + r.err
    assert "Traceback" not in r.out + r.err
    assert trainers_of(first) == [], "cancel stopped the dead driver's ranks"
    assert processes_naming(str(ws.workdir / "cancelgone" / "parsl")) == [], "and its Parsl processes"
    view = ledger_view(ws, "cancelgone")
    assert view["attempts"][0]["state"] == "cancelled"
    assert [s for s, _ in view["attempts"][0]["steps"]] == [row["step"] for row in _rows(first / "metrics.jsonl")]
    assert ws.status("cancelgone")["state"] == "cancelled"
    assert view["exclusions"] == []
    from campaign.report import _node_local_dir

    assert not any(_node_local_dir(str(first), node, "1").exists() for node in ("local-n0", "local-n1", "local-n2"))
    r = ws.cli("resume", "cancelgone", CAMPAIGN_ALLOW_FAULTS="1")  # and resume continues it
    assert r.code == 0, r.out + r.err
    view = ledger_view(ws, "cancelgone")
    assert view["stage"] == "passed"
    assert {s for a in view["attempts"] for s, _ in a["steps"]} == set(range(1, STEPS + 1)), "rows lost"


def test_resume_after_the_run_directory_was_deleted_passes(ws: Workspace) -> None:
    """The driver killed and the running attempt's run directory deleted. Before: every
    `resume` crashed (FileNotFoundError on STOP); after a mkdir, every resume failed the stage.
    Now resume makes the folder again, stops the old ranks (found by their run directory),
    adopts the checkpoints and relaunches from the newest complete one."""
    spec = ws.write_spec(tiny_spec("rmrun", [long_run(steps=120, checkpoint_every=10, faults=[SLOW])]))
    p = ws.popen("submit", str(spec), CAMPAIGN_ALLOW_FAULTS="1")
    first = ws.workdir / "rmrun" / "long" / "attempt-001"
    wait_for_steps(first / "metrics.jsonl", 25)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    shutil.rmtree(first)
    r = ws.cli("resume", "rmrun", CAMPAIGN_ALLOW_FAULTS="1")
    assert r.code == 0, r.out + r.err
    assert "Traceback" not in r.out + r.err
    assert trainers_of(first) == []
    view = ledger_view(ws, "rmrun")
    assert view["stage"] == "passed", view["verdict"]
    assert view["attempts"][0]["state"] == "orphaned" and view["attempts"][0]["summary"]["adopted"]["checkpoints"] >= 1
    assert view["exclusions"] == []
    last = view["attempts"][-1]["steps"][-1]
    assert last[0] == 120 and view["tokens"] == last[1]
    missing = set(range(1, 121)) - {s for a in view["attempts"] for s, _ in a["steps"]}
    assert len(missing) <= 20, f"rows lost beyond what went with the folder: {sorted(missing)}"
    print(f"rows lost with the deleted folder: {len(missing)}")
