"""One driver per campaign: a lease row in the ledger, renewed while the driver runs.

A second `campaign submit` or `campaign resume` of a campaign whose lease is held is
refused, naming the holder. A lease is stale, and taken over atomically, when its holder
on this host is gone (dead pid, or a pid that is no campaign driver any more), or when a
holder on another host has not renewed it within its ttl. A driver that finds its lease
taken stops without touching the trainers (the new holder adopts them).
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError

from campaign.errors import CampaignConflict, DiskFull, LedgerError
from campaign.ledger import Ledger
from campaign.ledger import reads, writes
from campaign.ledger.models import Campaign, Lease, db_utcnow

TTL_S = 60.0
"""A lease not renewed for this long is stale (its driver hung or died elsewhere)."""
RENEW_S = 10.0
RELEASE_WAIT_S = 60.0
"""How long a driver that is ending retries releasing its lease while the ledger does not answer."""
"""How often a running driver renews its lease."""


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def driver_alive(pid: int) -> bool:
    """Whether `pid` on this host is still a campaign driver: alive, and (where /proc shows
    it) a process whose command line names campaign, so a recycled pid does not count. A
    stopped driver (SIGSTOP, Ctrl-Z) is alive: its lease must not be taken from under it."""
    if pid == os.getpid():
        return True
    if not process_alive(pid):
        return False
    try:
        return b"campaign" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


class DriverLease:
    """The lease of this process on one campaign; renews itself in a daemon thread."""

    def __init__(self, ledger: Ledger, campaign_id: int, *, ttl_s: float = TTL_S,
                 on_lost: Callable[[str], None] | None = None) -> None:
        """`on_lost(why)` is called (from the renewal thread) if another driver took the lease."""
        self.ledger, self.campaign_id, self.ttl_s = ledger, campaign_id, ttl_s
        self.host, self.pid, self.token = socket.gethostname(), os.getpid(), uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.took_over: dict[str, Any] | None = None
        self.on_lost = on_lost

    def acquire(self) -> None:
        """Take the lease or raise CampaignConflict naming the live holder.

        Taking over is a compare-and-swap on the holder's token (an UPDATE ... WHERE token =
        the one we judged stale), so of two drivers that judge the same lease stale at once,
        exactly one wins; the first lease of a campaign is an INSERT that the unique
        campaign_id lets only one driver make. A holder on this host whose process still
        runs is never taken over, however old its renewal (stopped with SIGSTOP or Ctrl-Z,
        or the clock jumped): only a holder on another host can be judged by age alone, and
        on the ledger's clock (PostgreSQL's server clock: a host whose own clock is wrong
        neither loses nor steals a lease)."""
        try:
            with self.ledger.session(fenced=False) as s:
                c = s.get(Campaign, self.campaign_id)
                assert c is not None
                held = reads.get_lease(s, c)
                if held is None:  # insert only: a row that appeared since the look is another driver's
                    writes.first_lease(s, c, host=self.host, pid=self.pid, token=self.token, ttl_s=self.ttl_s)
                elif held.token != self.token:
                    self._take_over(s, c, held)
        except (IntegrityError, OperationalError) as e:
            # IntegrityError: both inserted the first lease; OperationalError: SQLite refuses the
            # stale snapshot of the driver that lost the race to write ("database is locked").
            if isinstance(e, OperationalError) and "locked" not in str(e):
                raise
            raise CampaignConflict(f"another driver took the lease of campaign {self.campaign_id} at the same "
                                   "moment; watch it with `campaign status`") from None
        self.ledger.fence = (self.campaign_id, self.token)  # every later write checks it (db._check_fence)
        self._thread = threading.Thread(target=self._renew, name="campaign-lease", daemon=True)
        self._thread.start()

    def _take_over(self, s: Any, c: Campaign, held: Any) -> None:
        now = db_utcnow(s)  # ages on the ledger's clock: the holder renewed on it too
        age = (now - held.renewed).total_seconds()
        here = held.host == self.host
        if is_live(held, now):
            stalled = f"; it has not renewed for {age:.0f} s: is it stopped (Ctrl-Z, SIGSTOP)? `kill -CONT {held.pid}`" \
                if here and age >= held.ttl_s else ""
            raise CampaignConflict(
                f"campaign {c.name!r} is being driven by pid {held.pid} on {held.host} (lease renewed {age:.0f} s "
                f"ago{stalled}); watch it with `campaign status {c.name}`, or stop it with `campaign cancel {c.name}`")
        # The ORM UPDATE below synchronizes `held` in the session (its host and pid become ours):
        # name the holder from what it was before, or the event would name this driver.
        was_host, was_pid = held.host, held.pid
        taken = s.execute(sa.update(Lease).where(Lease.campaign_id == c.id, Lease.token == held.token)
                          .values(host=self.host, pid=self.pid, token=self.token, ttl_s=self.ttl_s, renewed=now))
        if taken.rowcount != 1:
            raise CampaignConflict(f"campaign {c.name!r}: another driver took over the stale lease first; "
                                   f"watch it with `campaign status {c.name}`")
        self.took_over = {"host": was_host, "pid": was_pid, "age_s": round(age, 1), "dead": here}
        writes.add_event(s, c, "lease_taken_over", f"took over a stale lease of pid {was_pid} on {was_host} "
                         f"({'process gone' if here else f'not renewed for {age:.0f} s'})")

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_S):
            try:
                with self.ledger.session(fenced=False) as s:
                    kept = s.execute(sa.update(Lease).where(Lease.campaign_id == self.campaign_id,
                                                            Lease.token == self.token).values(renewed=db_utcnow(s)))
                    holder = None if kept.rowcount == 1 else s.scalar(
                        sa.select(Lease).where(Lease.campaign_id == self.campaign_id))
                    why = None if kept.rowcount == 1 else (
                        f"pid {holder.pid} on {holder.host} took over this campaign's lease" if holder
                        else "this campaign's lease was removed")
            except Exception:  # a busy database must not kill the driver; the next renewal retries
                continue
            if why is not None:
                if self.on_lost is not None:
                    self.on_lost(why)
                return

    def release(self, wait_s: float = RELEASE_WAIT_S) -> None:
        """Drop this driver's lease row, retrying through an outage for up to `wait_s`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.ledger.fence = None
        try:  # through an outage, for a while: a lease left behind makes the next driver wait
            for unit in self.ledger.retrying("releasing the lease", outage_s=wait_s, fenced=False):
                with unit as s:
                    c = s.get(Campaign, self.campaign_id)
                    if c is not None:
                        writes.drop_lease(s, c, self.token)
        except (LedgerError, DiskFull):
            pass  # still unreachable (or no room): the lease outlives this process, a resume here takes it over


def is_live(held: Any, now: dt.datetime) -> bool:
    """Whether a lease row's driver still runs: when it was taken on this host, its process
    exists; else it was renewed within its ttl before `now`, the ledger's clock (`db_utcnow`).
    (Take-over refuses such a lease; `campaign submit --endpoint` attaches to its driver.)"""
    if held.host == socket.gethostname():
        return driver_alive(held.pid)
    return (now - held.renewed).total_seconds() < held.ttl_s
