"""Ledger outages under a running campaign (issue 13, item 3): the driver outlives them and
no row the trainer reported is lost. Both are real: a PostgreSQL server of the test's own
is stopped and started with its cluster tool, and another connection holds SQLite's write
lock."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from campaign.supervisor import free_port
from e2e_helpers import Workspace, tiny_spec

pytestmark = pytest.mark.slow

STEPS = 150


def long_run() -> dict[str, Any]:
    return {"name": "long", "kind": "long_run", "nodes": 2, "steps": STEPS, "checkpoint_every": 50,
            "max_attempts": 2, "timeout_s": 300,
            "watchdog": {"startup_s": 120, "step_factor": 3, "floor_s": 4, "heartbeat_stale_s": 5}}


def run_through(ws: Workspace, name: str, outage: Callable[[], None], **env: str) -> tuple[int, str]:
    spec = ws.write_spec(tiny_spec(name, [long_run()]))
    p = ws.popen("submit", str(spec), **env)
    metrics = ws.workdir / name / "long" / "attempt-001" / "metrics.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 10):
        time.sleep(0.2)
    assert metrics.exists(), "the long run never started"
    outage()
    try:
        out, _ = p.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        pytest.fail("the driver did not finish after the outage")
    return p.returncode, out


def rows_in_ledger(url: str, name: str) -> tuple[int, int]:
    """(step rows of the campaign in the ledger, steps reported in every metrics.jsonl)."""
    from campaign.ledger import open_ledger
    from campaign.ledger import reads

    ledger = open_ledger(url, create=False)
    try:
        with ledger.session() as s:
            c = reads.get_campaign(s, name)
            assert c is not None
            attempts = [a for _, a in reads.list_attempts(s, c)]
            stored = sum(len(reads.list_steps(s, a.id)) for a in attempts)
            reported = sum(len(Path(a.run_dir, "metrics.jsonl").read_text().splitlines()) for a in attempts)
            return stored, reported
    finally:
        ledger.close()


def test_a_held_sqlite_write_lock_of_15_s_loses_nothing(ws: Workspace) -> None:
    db = ws.workdir / "ledger.db"

    def hold_lock() -> None:
        con = sqlite3.connect(db, isolation_level=None, timeout=30)
        con.execute("BEGIN EXCLUSIVE")  # someone's long write (a backup, an import) holds the lock
        time.sleep(15)
        con.execute("COMMIT")
        con.close()

    code, out = run_through(ws, "locked", hold_lock)
    assert code == 0, out
    assert "the ledger is not answering" in out, "the user is told about the outage"
    stored, reported = rows_in_ledger(f"sqlite:///{db}", "locked")
    assert stored == reported >= STEPS, "every step the trainer reported is in the ledger"


@pytest.fixture
def own_postgres() -> Iterator[tuple[str, Callable[[], None]]]:
    """A PostgreSQL server of this test's own (Debian's pg_createcluster, trust auth, a free
    port): `(url, restart)`. Restarting the machine's shared server would break every other
    test (and person) using it at the time; this one is dropped at the end."""
    tools = [shutil.which(t) for t in ("pg_createcluster", "pg_ctlcluster", "pg_dropcluster")]
    assert all(tools), "Debian's postgresql-common (pg_createcluster, pg_ctlcluster) is needed to restart a server"
    create, ctl, drop = (str(t) for t in tools)
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    name = f"outage{os.getpid()}"
    port = free_port()
    made = subprocess.run([create, version, name, "-p", str(port), "--start", "--", "--auth=trust"],
                          capture_output=True, text=True)
    assert made.returncode == 0, f"pg_createcluster failed (it needs root):\n{made.stdout}{made.stderr}"

    def restart() -> None:
        subprocess.run([ctl, "--skip-systemctl-redirect", version, name, "stop", "-m", "fast"], check=True)
        time.sleep(3)  # the driver writes into a refused connection meanwhile
        subprocess.run([ctl, "--skip-systemctl-redirect", version, name, "start"], check=True)

    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", restart
    finally:
        subprocess.run([drop, "--stop", version, name], capture_output=True)


def test_a_postgres_restart_loses_nothing(ws: Workspace, own_postgres: tuple[str, Callable[[], None]]) -> None:
    url, restart = own_postgres
    code, out = run_through(ws, "pgrestart", restart, CAMPAIGN_DB_URL=url)
    assert code == 0, out
    stored, reported = rows_in_ledger(url, "pgrestart")
    assert stored == reported >= STEPS, "every step the trainer reported is in the ledger"


def _lease_rows(db: Path) -> int:
    con = sqlite3.connect(db, timeout=30)
    try:
        return int(con.execute("SELECT count(*) FROM lease").fetchone()[0])
    finally:
        con.close()


def test_an_outage_longer_than_the_retry_budget_ends_in_one_line_and_resumes(ws: Workspace) -> None:
    """Issue 30, item 6: near the attempt's end the SQLite write lock is held for 8 s, the
    retry budget is 3 s (each try waits 1 s for the lock). The driver stops with one line
    naming the ledger and the work (exit 2, no traceback; before: the stage recorded as
    crashed, exit 1), releases its lease once the ledger answers again (retried), and `resume`
    adopts every reported step."""
    db = ws.workdir / "ledger.db"
    steps = 60
    spec = ws.write_spec(tiny_spec("budget", [{**long_run(), "steps": steps}]))
    p = ws.popen("submit", str(spec), CAMPAIGN_LEDGER_OUTAGE_S="3", CAMPAIGN_LEDGER_BUSY_S="1")
    metrics = ws.workdir / "budget" / "long" / "attempt-001" / "metrics.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < steps - 15):
        time.sleep(0.05)
    con = sqlite3.connect(db, isolation_level=None, timeout=30)
    con.execute("BEGIN EXCLUSIVE")  # from near the attempt's end: its last writes cannot wait
    time.sleep(8)
    con.execute("COMMIT")
    con.close()
    try:
        out, _ = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        pytest.fail("the driver did not stop after the outage")
    assert p.returncode == 2, out
    assert "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and f"the ledger at sqlite:///{db} did not answer" in errors[0], out
    assert _lease_rows(db) == 0, "the lease was released once the ledger answered"
    r = ws.cli("resume", "budget")
    assert r.code == 0, r.out + r.err
    con = sqlite3.connect(db)
    stored = con.execute("SELECT count(*) FROM step_metric JOIN attempt ON attempt.id = step_metric.attempt_id "
                         "WHERE attempt.number = 1").fetchone()[0]
    con.close()
    assert stored == len(metrics.read_text().splitlines()) == steps, "every step the trainer reported is in the ledger"


def test_ctrl_c_during_a_ledger_outage_stops_the_driver_within_seconds(ws: Workspace) -> None:
    """Issue 30, item 6: Ctrl-C (SIGINT to the driver's process group) while the SQLite write
    lock is held for 40 s: the driver stops the attempt and exits 130 within seconds, not once
    the outage is over (before: it retried its writes until the lock was released); after the
    outage `resume` finishes the campaign."""
    db = ws.workdir / "ledger.db"
    spec = ws.write_spec(tiny_spec("ctrlc", [{**long_run(), "steps": 400}]))
    p = ws.popen("submit", str(spec), CAMPAIGN_LEDGER_BUSY_S="1")
    metrics = ws.workdir / "ctrlc" / "long" / "attempt-001" / "metrics.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 10):
        time.sleep(0.05)
    con = sqlite3.connect(db, isolation_level=None, timeout=30)
    con.execute("BEGIN EXCLUSIVE")
    try:
        time.sleep(2)  # the driver meets the outage
        t0 = time.time()
        os.killpg(p.pid, signal.SIGINT)
        try:
            out, _ = p.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            pytest.fail("the driver waited for the outage to end")
        stopped_s = time.time() - t0
    finally:
        con.execute("COMMIT")
        con.close()
    assert p.returncode == 130, out
    assert stopped_s < 10, f"stopped {stopped_s:.1f} s after Ctrl-C: {out}"
    assert "Traceback" not in out, out
    r = ws.cli("resume", "ctrlc")
    assert r.code == 0, r.out + r.err
