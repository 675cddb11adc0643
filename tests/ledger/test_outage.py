"""`Ledger.retrying`: a unit of work outlives a transient outage and gives up with a clear
error after its bound; errors that are not outages are raised at once."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from campaign.errors import LedgerError
from campaign.ledger import open_ledger
from campaign.ledger import reads, writes
from campaign.ledger.db import transient


@pytest.mark.parametrize("error,expected", [
    (sqlite3.OperationalError("database is locked"), True),
    (sa.exc.OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked")), True),
    (sa.exc.OperationalError("x", {}, Exception("connection refused\n\tIs the server running")), True),
    (sa.exc.OperationalError("x", {}, Exception("terminating connection due to administrator command")), True),
    (sqlite3.OperationalError("no such table: campaign"), False),
    (sa.exc.IntegrityError("x", {}, Exception("UNIQUE constraint failed")), False),
    (ValueError("database is locked"), False),
])
def test_what_counts_as_an_outage(error: BaseException, expected: bool) -> None:
    assert transient(error) is expected


def test_a_write_waits_out_a_held_lock_and_lands_once(tmp_path: Path) -> None:
    ledger = open_ledger(f"sqlite:///{tmp_path / 'l.db'}")
    holder = sqlite3.connect(tmp_path / "l.db", isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    threading.Timer(11, lambda: holder.execute("COMMIT")).start()  # past the 10 s busy timeout
    told: list[str] = []
    tries = 0
    for unit in ledger.retrying("registering", warn=told.append):
        tries += 1
        with unit as s:
            writes.create_campaign(s, name="x", digest="d", spec_json={}, source="", site="local", workdir="/", spec_dir="/")
    assert tries >= 2 and len(told) == 1 and "retrying" in told[0]
    with ledger.session() as s:
        assert [c.name for c in reads.list_campaigns(s)] == ["x"]
    ledger.close()


def test_an_outage_past_the_bound_names_the_ledger_and_the_work(tmp_path: Path) -> None:
    ledger = open_ledger(f"sqlite:///{tmp_path / 'l.db'}")
    holder = sqlite3.connect(tmp_path / "l.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    with pytest.raises(LedgerError, match=r"did not answer for \d+ s while registering: .*locked"):
        for unit in ledger.retrying("registering", outage_s=0.5):
            with unit as s:
                s.execute(sa.text("PRAGMA busy_timeout=100"))
                writes.create_campaign(s, name="x", digest="d", spec_json={}, source="", site="local", workdir="/",
                                       spec_dir="/")
    holder.execute("COMMIT")
    ledger.close()


def test_a_bug_is_not_retried(tmp_path: Path) -> None:
    ledger = open_ledger(f"sqlite:///{tmp_path / 'l.db'}")
    tries = 0
    with pytest.raises(ZeroDivisionError):
        for unit in ledger.retrying("dividing"):
            tries += 1
            with unit:
                1 / 0  # noqa: B018
    assert tries == 1
    ledger.close()
