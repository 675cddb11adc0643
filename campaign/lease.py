"""One driver per campaign: a lease row in the ledger, renewed while the driver runs.

A second `campaign submit` or `campaign resume` of a campaign whose lease is fresh is
refused, naming the holder. A lease whose holder process is gone (same host, dead pid)
or that was not renewed within its ttl is stale and is taken over.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from typing import Any

from campaign.errors import CampaignConflict
from campaign.ledger import Ledger
from campaign.ledger import queries as q
from campaign.ledger.models import Campaign, utcnow

TTL_S = 60.0
"""A lease not renewed for this long is stale (its driver hung or died elsewhere)."""
RENEW_S = 10.0
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


class DriverLease:
    """The lease of this process on one campaign; renews itself in a daemon thread."""

    def __init__(self, ledger: Ledger, campaign_id: int, *, ttl_s: float = TTL_S) -> None:
        self.ledger, self.campaign_id, self.ttl_s = ledger, campaign_id, ttl_s
        self.host, self.pid, self.token = socket.gethostname(), os.getpid(), uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.took_over: dict[str, Any] | None = None

    def acquire(self) -> None:
        """Take the lease or raise CampaignConflict naming the live holder."""
        with self.ledger.session() as s:
            c = s.get(Campaign, self.campaign_id)
            assert c is not None
            held = q.get_lease(s, c)
            if held is not None and held.token != self.token:
                age = (utcnow() - held.renewed).total_seconds()
                dead = held.host == self.host and not process_alive(held.pid)
                if not dead and age < held.ttl_s:
                    raise CampaignConflict(
                        f"campaign {c.name!r} is being driven by pid {held.pid} on {held.host} (lease renewed {age:.0f} s "
                        f"ago); watch it with `campaign status {c.name}`, or stop it with `campaign cancel {c.name}`")
                self.took_over = {"host": held.host, "pid": held.pid, "age_s": round(age, 1), "dead": dead}
                q.add_event(s, c, "lease_taken_over", f"took over a stale lease of pid {held.pid} on {held.host} "
                            f"({'process gone' if dead else f'not renewed for {age:.0f} s'})")
            q.take_lease(s, c, host=self.host, pid=self.pid, token=self.token, ttl_s=self.ttl_s)
        self._thread = threading.Thread(target=self._renew, name="campaign-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_S):
            try:
                with self.ledger.session() as s:
                    c = s.get(Campaign, self.campaign_id)
                    lease = q.get_lease(s, c) if c else None
                    if lease is not None and lease.token == self.token:
                        lease.renewed = utcnow()
            except Exception:  # a busy database must not kill the driver; the next renewal retries
                continue

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self.ledger.session() as s:
            c = s.get(Campaign, self.campaign_id)
            if c is not None:
                q.drop_lease(s, c, self.token)


def is_live(held: Any) -> bool:
    """Whether a lease row's driver still runs: renewed within its ttl and, when it was taken
    on this host, its process exists. (`campaign submit --endpoint` attaches to such a driver.)"""
    age = (utcnow() - held.renewed).total_seconds()
    dead = held.host == socket.gethostname() and not process_alive(held.pid)
    return not dead and age < held.ttl_s
