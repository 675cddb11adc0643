"""What the driver promises when it is itself the thing that fails (issue 13): signals from
the terminal, a driver killed while its trainer goes on, and a new version of a campaign.
Real processes throughout: the CLI driver in its own session (like a login shell), Parsl
HTEX on the local site, gloo training on virtual nodes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from e2e_helpers import Workspace, ledger_view, tiny_spec

pytestmark = pytest.mark.slow

WATCHDOG = {"startup_s": 120, "step_factor": 3, "floor_s": 4, "heartbeat_stale_s": 5}


def long_run(**over: Any) -> dict[str, Any]:
    stage = {"name": "long", "kind": "long_run", "nodes": 2, "steps": 400, "checkpoint_every": 20,
             "max_attempts": 3, "backoff_s": 0, "timeout_s": 300, "watchdog": WATCHDOG}
    stage.update(over)
    return stage


def wait_for_steps(metrics: Path, n: int, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < n):
        time.sleep(0.2)
    assert metrics.exists() and len(metrics.read_text().splitlines()) >= n, f"{metrics} never reached {n} steps"


def finish(p: subprocess.Popen[str], timeout: float, hung: str) -> str:
    """The driver's output once it exits; the test fails with `hung` (and the driver is killed) past `timeout`."""
    try:
        return p.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        pytest.fail(hung)


def processes_naming(text: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", text], capture_output=True, text=True).stdout.split()


def trainers_of(run_dir: Path) -> list[int]:
    """Live processes whose environment names this attempt's run directory, or that work in
    it: a rank forked by the warm-start server (campaign.executors.warm) has the server's
    /proc/PID/environ, but its working directory is the attempt's, as every rank's is."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (f"CAMPAIGN_RUN_DIR={run_dir}".encode() in (proc / "environ").read_bytes()
                        or os.readlink(proc / "cwd") == str(run_dir)):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_terminals_process_group_stops_cleanly(ws: Workspace, sig: signal.Signals) -> None:
    """Ctrl-C (SIGINT to the whole foreground process group) or a closed ssh session (SIGHUP):
    the driver stops the attempt, records the campaign cancelled and exits 130; Parsl's
    interchange, which has its own process group, is not killed under it (before, it died
    and the driver waited forever on its future)."""
    name = f"sig{sig.value}"
    spec = ws.write_spec(tiny_spec(name, [long_run()]))
    p = ws.popen("submit", str(spec))
    run_dir = ws.workdir / name / "long" / "attempt-001"
    wait_for_steps(run_dir / "metrics.jsonl", 10)
    os.killpg(p.pid, sig)
    out = finish(p, 90, "the driver did not exit within 90 s of the signal")
    assert p.returncode == 130, out
    assert ws.status(name)["state"] == "cancelled"
    assert trainers_of(run_dir) == [], "no trainer outlives a cancelled driver"
    assert processes_naming(str(ws.workdir / name / "parsl")) == [], "Parsl's processes ended with the driver"


def test_a_trainer_that_finishes_after_its_driver_died_is_adopted_by_resume(ws: Workspace) -> None:
    """kill -9 of the driver while the trainer goes on to the target: `resume` takes the
    orphan's steps and checkpoints into the ledger, and the relaunch (which resumes at the
    target and trains nothing) passes on them. Before: "short of the target" forever, and
    the ledger held a fraction of the trained tokens."""
    spec = ws.write_spec(tiny_spec("adopt", [long_run(steps=120)]))
    p = ws.popen("submit", str(spec))
    run_dir = ws.workdir / "adopt" / "long" / "attempt-001"
    wait_for_steps(run_dir / "metrics.jsonl", 10)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    wait_for_steps(run_dir / "metrics.jsonl", 120, timeout=240)  # the orphan trains on to the target
    deadline = time.time() + 60
    while trainers_of(run_dir) and time.time() < deadline:
        time.sleep(0.5)
    parsl_dir = str(ws.workdir / "adopt" / "parsl")
    deadline = time.time() + 90  # the interchange exits with its driver; the workers when it stops answering
    while processes_naming(parsl_dir) and time.time() < deadline:
        time.sleep(1)
    assert processes_naming(parsl_dir) == [], "no Parsl process outlives its driver (it would hold the block)"
    r = ws.cli("resume", "adopt")
    assert r.code == 0, r.out + r.err
    view = ledger_view(ws, "adopt")
    orphan = view["attempts"][0]
    assert orphan["state"] == "orphaned" and orphan["last_step"] == 120
    assert [s for s, _ in orphan["steps"]] == list(range(1, 121)), "every step the orphan trained is in the ledger"
    tokens_at_target = orphan["steps"][-1][1]
    assert view["stage"] == "passed" and view["tokens"] == tokens_at_target
    assert orphan["summary"]["adopted"]["checkpoints"] >= 1  # the trainer keeps its newest few


def test_a_new_version_trains_in_its_own_directories(ws: Workspace) -> None:
    """v2 of a campaign never resumes v1's checkpoints or reuses its run directories."""
    first = ws.write_spec(tiny_spec("versions", [long_run(steps=40)]))
    assert ws.cli("submit", str(first)).code == 0
    second = ws.write_spec(tiny_spec("versions", [long_run(steps=30)]), name="v2.yaml")
    r = ws.cli("submit", str(second), "--new-version")
    assert r.code == 0, r.out + r.err
    v2 = ws.workdir / "versions" / "v2" / "long" / "attempt-001"
    assert (v2 / "metrics.jsonl").exists(), "v2's attempts live under versions/v2/"
    first_step = int(json.loads((v2 / "metrics.jsonl").read_text().splitlines()[0])["step"])
    assert first_step == 1, "v2 started from scratch, not from v1's step-40 checkpoint"
    assert sorted(p.name for p in (ws.workdir / "versions" / "long").glob("attempt-*")) == ["attempt-001"]


def test_the_interchange_dying_under_an_attempt_does_not_hang_the_driver(ws: Workspace) -> None:
    """Before, the driver waited forever on a future nobody would answer. Now it notices,
    stops the job, loads Parsl again and the long run finishes."""
    spec = ws.write_spec(tiny_spec("lostxchg", [long_run(steps=80)]))
    p = ws.popen("submit", str(spec))
    run_dir = ws.workdir / "lostxchg" / "long" / "attempt-001"
    wait_for_steps(run_dir / "metrics.jsonl", 10)
    interchange = json.loads((ws.workdir / "lostxchg" / "driver.json").read_text())["interchange_pid"]
    os.kill(interchange, signal.SIGKILL)
    out = finish(p, 300, "the driver hung after its Parsl interchange died")
    assert p.returncode == 0, out
    view = ledger_view(ws, "lostxchg")
    assert view["stage"] == "passed"
    assert any(k == "block_restarted" and "interchange exited" in m for k, m in view["events"]), view["events"]


STEPS = 100
SLOW = {"kind": "slow", "step": 1, "delay_s": 0.02}
"""At least 20 ms a step: the lost attempt's ranks would still train when Parsl reports the loss."""


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_lost_worker_stops_its_ranks_before_the_relaunch(ws: Workspace) -> None:
    """Issue 30, item 1: the Parsl worker that runs the supervisor is killed (kill -9, as the
    OOM killer would). Before, the relaunch started while the lost supervisor's ranks trained
    on into the same checkpoint folder, and their later rows were never ingested. Now the
    driver stops those ranks (and waits for them) before it records `block_lost`, ingests
    every row they wrote, and the relaunch starts after their last one."""
    spec = ws.write_spec(tiny_spec("lostwkr", [long_run(steps=STEPS, checkpoint_every=10, faults=[SLOW])]))
    p = ws.popen("submit", str(spec), CAMPAIGN_ALLOW_FAULTS="1")
    first = ws.workdir / "lostwkr" / "long" / "attempt-001"
    wait_for_steps(first / "metrics.jsonl", 15)
    pids = json.loads((first / "pids.json").read_text())
    worker = _parent(pids["pgids"][0])  # the launch's processes are the supervisor's children
    os.kill(worker, signal.SIGKILL)
    out = finish(p, 300, "the driver hung after the supervisor's worker died")
    view = ledger_view(ws, "lostwkr")
    assert view["stage"] == "passed" and view["attempts"][0]["state"] == "block_lost", out
    files = [ws.workdir / "lostwkr" / "long" / f"attempt-{i:03d}" / "metrics.jsonl" for i in (1, 2)]
    rows = [[json.loads(line) for line in f.read_text().splitlines()] if f.exists() else [] for f in files]
    assert [s for s, _ in view["attempts"][0]["steps"]] == [r["step"] for r in rows[0]], "every orphan row ingested"
    # The lost attempt's ranks may reach the last step before the driver learns the worker is
    # gone (seen on an idle machine): then the relaunch loads that step and trains none.
    assert rows[1] == [] and rows[0][-1]["step"] == STEPS or rows[1][0]["time"] > rows[0][-1]["time"], \
        "the relaunch began after the lost attempt's last step"
    assert not trainers_of(first), "no rank of the lost attempt survives"
    assert view["exclusions"] == [], "a lost worker is not a node's fault"
    steps = {s for a in view["attempts"] for s, _ in a["steps"]}
    assert steps == set(range(1, STEPS + 1)), "no step lost"


def _stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, state, start time) of a live process, or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), fields[0], fields[19]


def _tagged(tag: str) -> dict[tuple[int, str], str]:
    """Live processes whose environment holds PTABLE_TAG=`tag` (every process a driver started
    inherits it: Parsl's block is started through a shell that exits, so it is no descendant
    of the driver by parent pid): (pid, start time) -> command line."""
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or (st := _stat(int(proc.name))) is None or st[1] == "Z":
            continue
        try:
            if f"PTABLE_TAG={tag}".encode() not in (proc / "environ").read_bytes():
                continue
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
        except OSError:
            continue
        out[(int(proc.name), st[2])] = cmd
    return out


def _watch_tagged(tag: str, p: subprocess.Popen[str], seen: dict[tuple[int, str], str], until: Any) -> None:
    """Every process started under `tag`, polled while `until()` is false and `p` runs."""
    while not until() and p.poll() is None:
        seen.update(_tagged(tag))
        time.sleep(0.2)


def _survivors(seen: dict[tuple[int, str], str], grace_s: float = 10.0) -> list[str]:
    deadline = time.time() + grace_s
    while True:
        alive = [f"{pid} {cmd}" for (pid, start), cmd in seen.items()
                 if (st := _stat(pid)) is not None and st[2] == start and st[1] != "Z"]
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.2)


def test_no_process_outlives_its_campaign(ws: Workspace) -> None:
    """Issue 29, item 7 and issue 30, item 8: the process table after kill -9 of the driver
    and `campaign resume`, and after a normal end. Every process the first driver started
    (Parsl's interchange, the block's worker pool, its workers, multiprocessing's helpers,
    the warm-start servers, the ranks) is gone once the resume has ended, and so is every
    process the resume started (within 10 s of its exit)."""
    spec = ws.write_spec(tiny_spec("ptable", [long_run(steps=40, checkpoint_every=10, faults=[SLOW])]))
    first_seen: dict[tuple[int, str], str] = {}
    p = ws.popen("submit", str(spec), CAMPAIGN_ALLOW_FAULTS="1", PTABLE_TAG="first")
    metrics = ws.workdir / "ptable" / "long" / "attempt-001" / "metrics.jsonl"
    _watch_tagged("first", p, first_seen, lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 5)
    first_seen.update(_tagged("first"))
    assert any("process_worker_pool" in c for c in first_seen.values()), first_seen
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    resumed_seen: dict[tuple[int, str], str] = {}
    r = ws.popen("resume", "ptable", CAMPAIGN_ALLOW_FAULTS="1", PTABLE_TAG="resumed")
    _watch_tagged("resumed", r, resumed_seen, lambda: False)
    out = finish(r, 300, "resume hung")
    assert r.returncode == 0, out
    assert any("process_worker_pool" in c for c in resumed_seen.values()), resumed_seen
    assert _survivors(first_seen, 0) == [], f"processes of the killed driver outlived the resume: {_survivors(first_seen, 0)}"
    assert _survivors(resumed_seen) == [], f"processes of the resume outlived its normal end: {_survivors(resumed_seen, 0)}"


def test_a_full_work_directory_ends_in_one_line_and_leaves_nothing_behind(ws: Workspace) -> None:
    """Issue 30, items 6 and 8: the campaign's folder is a real tmpfs (root only) that fills
    up under a running long run. The driver ends with one line naming the cause, no
    traceback, no attempt left `running`, its lease released; nothing is left in /dev/shm."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    folder = ws.workdir / "enospc"
    folder.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)], capture_output=True,
                             text=True)
    assert mounted.returncode == 0, f"cannot mount a tmpfs for the test: {mounted.stderr}"
    try:
        spec = ws.write_spec(tiny_spec("enospc", [long_run(steps=400, checkpoint_every=1000)]))
        p = ws.popen("submit", str(spec))
        wait_for_steps(folder / "long" / "attempt-001" / "metrics.jsonl", 10)
        with open(folder / "filler", "wb") as f:  # someone else's file fills the disk
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        out = finish(p, 120, "the driver hung on a full work directory")
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
    assert p.returncode in (1, 2), out
    assert "Traceback" not in out, out
    view = ledger_view(ws, "enospc")
    assert all(a["state"] != "running" for a in view["attempts"]), view["attempts"]
    assert "No space left on device" in out, out
    ledger = ws.ledger()
    try:
        from campaign.ledger.models import Lease

        with ledger.session() as s:
            assert s.query(Lease).count() == 0, "the lease was released"
    finally:
        ledger.close()
    from campaign.report import _node_local_dir

    left = [d for i in range(1, len(view["attempts"]) + 1) for node in ("local-n0", "local-n1", "local-n2")
            if (d := _node_local_dir(str(folder / "long" / f"attempt-{i:03d}"), node, str(i))).exists()]
    assert left == [], "node-local state left in /dev/shm"


def _fill(path: Path) -> None:
    """Someone else's file fills the file system holding `path`."""
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass


def test_a_full_disk_under_the_ledger_and_the_work_directory_ends_in_one_line(ws: Workspace) -> None:
    """Issue 39, item 4: the default layout (the SQLite ledger inside the work directory) on a
    real tmpfs (root only) that fills up under a running long run. Before: 129 lines with 4
    tracebacks, the attempt left `running`, 3 processes and 2 /dev/shm folders left. Now: one
    line naming the cause, exit 2, no traceback, nothing the driver started left running,
    nothing in /dev/shm, and the ledger (read once there is room again) says what happened:
    no attempt `running`, no lease held, the campaign resumable."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    ws.workdir.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(ws.workdir)],
                             capture_output=True, text=True)
    assert mounted.returncode == 0, f"cannot mount a tmpfs for the test: {mounted.stderr}"
    try:
        spec = ws.write_spec(tiny_spec("fulldisk", [long_run(steps=400, checkpoint_every=1000)]))
        p = ws.popen("submit", str(spec), PTABLE_TAG="fulldisk")
        seen: dict[tuple[int, str], str] = {}
        metrics = ws.workdir / "fulldisk" / "long" / "attempt-001" / "metrics.jsonl"
        _watch_tagged("fulldisk", p, seen, lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 10)
        _fill(ws.workdir / "filler")
        deadline = time.time() + 120
        while p.poll() is None and time.time() < deadline:
            seen.update(_tagged("fulldisk"))
            time.sleep(0.2)
        out = finish(p, 1, "the driver hung on a full disk")
        left = _survivors(seen)
        (ws.workdir / "filler").unlink()  # room again: read what the ledger says
        view = ledger_view(ws, "fulldisk")
        from campaign import report

        written = [r["step"] for a in view["attempts"] for r in report.read_metrics(a["run_dir"])[0]]
        with_lease = ws.ledger()
        try:
            from campaign.ledger.models import Lease

            with with_lease.session() as s:
                leases = s.query(Lease).count()
        finally:
            with_lease.close()
        from campaign.report import _node_local_dir

        shm = [str(d) for i, a in enumerate(view["attempts"], 1) for node in ("local-n0", "local-n1", "local-n2")
               if (d := _node_local_dir(a["run_dir"], node, str(i))).exists()]
    finally:
        subprocess.run(["umount", "-l", str(ws.workdir)], check=False)
    lines = [x for x in out.splitlines() if x.strip()]
    assert "Traceback" not in out, out
    assert p.returncode == 2, out
    assert "No space left on device" in out or "disk is full" in out, out
    assert [x for x in lines if x.startswith("error:")] == lines[-1:], out  # one line says why, the last
    assert len(lines) <= 6, out  # the campaign, the stage, the attempt, its progress, the error
    assert left == [], f"processes the driver started outlived it: {left}"
    assert shm == [], "node-local state left in /dev/shm"
    assert view["attempts"] and all(a["state"] != "running" for a in view["attempts"]), view["attempts"]
    assert leases == 0, "the lease was released"
    assert [st for a in view["attempts"] for st, _ in a["steps"]] == written, "every row the trainer wrote is in the ledger"
    assert view["exclusions"] == [], "a full disk is no node's fault"
    assert view["stage"] == "failed" and "file system is full" in (view["verdict"] or ""), view["verdict"]
