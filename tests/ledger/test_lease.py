"""The driver lease on SQLite and the real PostgreSQL: one driver per campaign, take-over
only of a lease whose holder is gone, atomically, and a driver that lost its lease knows."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
import time

import pytest

from campaign import lease as lease_mod
from campaign.errors import CampaignConflict
from campaign.lease import DriverLease
from campaign.ledger import Ledger, open_ledger
from campaign.ledger import reads, writes
from campaign.ledger.models import Lease, utcnow


@pytest.fixture
def campaign_id(ledger: Ledger) -> int:
    with ledger.session() as s:
        c = writes.create_campaign(s, name="leased", digest="d", spec_json={}, source="", site="local", workdir="/w",
                                   spec_dir="/s")
        s.flush()
        return int(c.id)


def _hold(ledger: Ledger, campaign_id: int, *, pid: int, host: str, age_s: float) -> None:
    with ledger.session() as s:
        s.add(Lease(campaign_id=campaign_id, host=host, pid=pid, token="theirs", ttl_s=60.0,
                    renewed=utcnow() - dt.timedelta(seconds=age_s)))


def _holder(ledger: Ledger, campaign_id: int) -> tuple[int, str]:
    with ledger.session() as s:
        row = s.query(Lease).filter_by(campaign_id=campaign_id).one()
        return row.pid, row.token


def _wait_until_a_driver(pid: int) -> None:
    """Until the lease sees `pid` as a driver: between fork and exec its command line is still
    pytest's, which names no campaign (a loaded machine shows that window)."""
    deadline = time.monotonic() + 30
    while not lease_mod.driver_alive(pid):
        assert time.monotonic() < deadline, f"pid {pid} did not exec within 30 s"
        time.sleep(0.01)


def test_a_stopped_driver_on_this_host_keeps_its_lease_however_old(ledger: Ledger, campaign_id: int) -> None:
    """SIGSTOP / Ctrl-Z: the process lives but does not renew. Taking its lease would make two drivers."""
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "campaign-driver"])
    try:
        _wait_until_a_driver(stopped.pid)
        _hold(ledger, campaign_id, pid=stopped.pid, host=lease_mod.socket.gethostname(), age_s=3600)
        with pytest.raises(CampaignConflict, match=rf"pid {stopped.pid} .*kill -CONT {stopped.pid}"):
            DriverLease(ledger, campaign_id).acquire()
        assert _holder(ledger, campaign_id) == (stopped.pid, "theirs")
    finally:
        stopped.kill()
        stopped.wait()


def test_a_dead_drivers_lease_is_taken_over_and_recorded(ledger: Ledger, campaign_id: int) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _hold(ledger, campaign_id, pid=gone.pid, host=lease_mod.socket.gethostname(), age_s=1)
    mine = DriverLease(ledger, campaign_id)
    mine.acquire()
    try:
        assert _holder(ledger, campaign_id)[1] == mine.token and mine.took_over and mine.took_over["dead"]
        with ledger.session() as s:
            c = reads.get_campaign(s, "leased")
            last = reads.list_events(s, c)[-1]
        # issue 30 item 7: the event names the dead holder's pid, not the new driver's
        assert last.kind == "lease_taken_over" and f"stale lease of pid {gone.pid} on " in last.message, last.message
        assert f"pid {mine.pid} " not in last.message, last.message
    finally:
        mine.release()


def test_a_fresh_lease_on_another_host_is_refused_a_stale_one_taken(ledger: Ledger, campaign_id: int) -> None:
    _hold(ledger, campaign_id, pid=1, host="login-other", age_s=5)
    with pytest.raises(CampaignConflict, match="is being driven by pid 1 on login-other"):
        DriverLease(ledger, campaign_id).acquire()
    with ledger.session() as s:
        s.query(Lease).filter_by(campaign_id=campaign_id).update({"renewed": utcnow() - dt.timedelta(seconds=600)})
    mine = DriverLease(ledger, campaign_id)
    mine.acquire()
    mine.release()


def test_two_drivers_taking_over_one_stale_lease_at_once_make_exactly_one_winner(
        ledger_url: str, campaign_id: int, ledger: Ledger) -> None:
    _hold(ledger, campaign_id, pid=1, host="login-other", age_s=600)
    ledgers = [open_ledger(ledger_url), open_ledger(ledger_url)]
    start = threading.Barrier(2)
    won: list[DriverLease] = []
    lost: list[str] = []

    def take(led: Ledger) -> None:
        candidate = DriverLease(led, campaign_id)
        start.wait()
        try:
            candidate.acquire()
            won.append(candidate)
        except CampaignConflict as e:
            lost.append(str(e))

    threads = [threading.Thread(target=take, args=(led,)) for led in ledgers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert len(won) == 1 and len(lost) == 1, (won, lost)
        assert _holder(ledger, campaign_id)[1] == won[0].token
    finally:
        for w in won:
            w.release()
        for led in ledgers:
            led.close()


def test_a_first_lease_inserted_between_our_look_and_our_write_stays_its_drivers(
        ledger: Ledger, campaign_id: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two submits on a fresh campaign: ours looks, finds no lease, and before it writes the
    other driver's first lease lands (on PostgreSQL, read committed, our next read sees it).
    Ours must be refused, not overwrite the row and drive a second copy of the campaign
    (seen under load in CI: two drivers, two attempts of one stage). The interleaving is
    forced by making our look return what it saw a moment earlier: nothing."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "campaign-driver"])
    try:
        _wait_until_a_driver(other.pid)
        _hold(ledger, campaign_id, pid=other.pid, host=lease_mod.socket.gethostname(), age_s=0)
        monkeypatch.setattr(lease_mod.reads, "get_lease", lambda s, c: None)  # the look before their insert
        with pytest.raises(CampaignConflict, match="another driver took the lease .* at the same moment"):
            DriverLease(ledger, campaign_id).acquire()
        monkeypatch.undo()
        assert _holder(ledger, campaign_id) == (other.pid, "theirs"), "the first driver keeps its lease"
    finally:
        other.kill()
        other.wait()


def test_a_driver_whose_lease_was_taken_is_told(ledger: Ledger, campaign_id: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease_mod, "RENEW_S", 0.1)
    told: list[str] = []
    mine = DriverLease(ledger, campaign_id, on_lost=told.append)
    mine.acquire()
    with ledger.session(fenced=False) as s:  # another driver's take-over, as its compare-and-swap leaves the row
        s.query(Lease).filter_by(campaign_id=campaign_id).update({"token": "theirs", "pid": 4242, "host": "n9"})
    deadline = time.time() + 10
    while not told and time.time() < deadline:
        time.sleep(0.05)
    mine.release()
    assert told == ["pid 4242 on n9 took over this campaign's lease"]
    assert _holder(ledger, campaign_id) == (4242, "theirs"), "releasing a lost lease leaves the new holder's row"


def test_a_holder_whose_host_clock_is_behind_keeps_its_lease_on_postgres(
        ledger: Ledger, campaign_id: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver on another host whose clock is 10 minutes slow renews its lease; a driver here
    must not judge that lease stale by comparing its own clock with the other host's. Both
    read PostgreSQL's clock. (SQLite runs in each driver's process: there the host's clock is
    the ledger's, and hosts sharing one SQLite file must keep their clocks in step.)"""
    if ledger.engine.dialect.name != "postgresql":
        pytest.skip("SQLite has no server clock")
    slow = utcnow() - dt.timedelta(minutes=10)
    monkeypatch.setattr("campaign.ledger.models.utcnow", lambda: slow)  # this host's clock, 10 min slow
    monkeypatch.setattr("campaign.ledger.writes.utcnow", lambda: slow)
    theirs = DriverLease(ledger, campaign_id)
    theirs.host = "login2"  # the other host, with the slow clock
    theirs.acquire()
    try:
        monkeypatch.undo()
        with pytest.raises(CampaignConflict, match="is being driven by pid"):
            DriverLease(ledger, campaign_id).acquire()
        assert _holder(ledger, campaign_id)[1] == theirs.token
    finally:
        theirs.release()
