"""Opening the ledger: engines, SQLite PRAGMAs, schema checks, and `session_scope()`.

    ledger = open_ledger("sqlite:///campaigns/ledger.db")   # created and migrated if new
    with ledger.session() as s:                               # commits, or rolls back on error
        queries.get_campaign(s, "demo")

A new (empty) database is migrated to the head revision on first use. A database at an
older revision is refused with the command that upgrades it; nothing is changed.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from campaign.errors import LedgerError


def default_url(workdir: str | Path) -> str:
    """The ledger a user gets with no configuration: SQLite inside the work directory."""
    return os.environ.get("CAMPAIGN_DB_URL") or f"sqlite:///{Path(workdir).resolve() / 'ledger.db'}"


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    # WAL: readers (`campaign status`) never block the single writer (the driver).
    cur.execute("PRAGMA journal_mode=WAL")
    # Foreign keys are off by default in SQLite; the schema relies on them for cascades.
    cur.execute("PRAGMA foreign_keys=ON")
    # A reader that meets a checkpointing writer waits instead of failing at once.
    cur.execute("PRAGMA busy_timeout=10000")
    # WAL with NORMAL survives a process crash (not a power loss) and is much faster.
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def make_engine(url: str) -> sa.Engine:
    """An engine for `url`; SQLite files get their directory created and their PRAGMAs set."""
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        raise LedgerError(f"not a database URL: {url!r} (expected e.g. sqlite:///path/ledger.db or postgresql+psycopg://host/db)") from None
    if parsed.drivername.startswith("sqlite"):
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(parsed)
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    try:
        return sa.create_engine(parsed, pool_pre_ping=True)
    except ModuleNotFoundError as e:
        raise LedgerError(f"no driver for {parsed.drivername}: {e}; for Postgres: pip install 'campaign[postgres]'") from None
    except sa.exc.NoSuchModuleError:
        raise LedgerError(f"unsupported database {parsed.drivername!r} in {parsed.render_as_string(hide_password=True)}: "
                          "the ledger is SQLite (sqlite:///path/ledger.db) or Postgres (postgresql://host/db)") from None


OUTAGE_S = float(os.environ.get("CAMPAIGN_LEDGER_OUTAGE_S", "600"))
"""How long the driver keeps retrying a ledger write through an outage before it gives up."""
_TRANSIENT = ("database is locked", "could not connect", "connection refused", "server closed the connection",
              "terminating connection", "connection is closed", "connection already closed", "the database system is",
              "consuming input failed", "ssl syscall", "connection timed out", "no connection to the server")


def transient(e: BaseException) -> bool:
    """Whether a database error is an outage that a retry can outlive (a Postgres restart, a
    dropped connection, a SQLite write lock held by someone else), not a bug or bad data."""
    if isinstance(e, sa.exc.DBAPIError) and e.connection_invalidated:
        return True
    # SQLAlchemy's wrappers, or the driver's own (PEP 249 names them so) where a fast path
    # uses the DBAPI cursor directly (step ingestion).
    names = {k.__name__ for k in type(e).__mro__}
    if not names & {"OperationalError", "InterfaceError"}:
        return False
    text = str(e.orig if isinstance(e, sa.exc.DBAPIError) else e).lower()
    return any(t in text for t in _TRANSIENT)


class _Try:
    """One try of a unit of work (see `Ledger.retrying`): a session that commits, and
    swallows a transient error so the loop can try again."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger, self.ok, self.error = ledger, False, None
        self._cm: Any = None

    def __enter__(self) -> Session:
        self._cm = self.ledger.session()  # a Session connects lazily: opening it cannot fail
        return self._cm.__enter__()  # type: ignore[no-any-return]

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:
        try:
            self._cm.__exit__(kind, value, tb)  # commits, or rolls back and re-raises
        except Exception as e:
            if not transient(e):
                raise
            self.error = e
            return True
        if value is None:
            self.ok = True
            return False
        if isinstance(value, Exception) and transient(value):  # rolled back above: try again
            self.error = value
            return True
        return False


@dataclass
class Ledger:
    """An open ledger: its URL, engine and session factory."""

    url: str
    engine: sa.Engine
    _factory: sessionmaker[Session]

    def retrying(self, what: str, *, outage_s: float | None = None,
                 warn: Callable[[str], None] | None = None) -> Iterator[_Try]:
        """A unit of work that outlives a ledger outage (the driver's writes use it):

            for unit in ledger.retrying("recording the attempt"):
                with unit as s:
                    ...                      # re-run from the start after a transient error

        Retries with backoff (0.25 s doubling to 5 s) for up to `outage_s` (default OUTAGE_S),
        telling `warn` once; then raises LedgerError naming the ledger and what was being done.
        A non-transient error is raised at once. Nothing is lost meanwhile: the trainer's
        metrics.jsonl is the source, ingested again once the ledger answers."""
        limit = OUTAGE_S if outage_s is None else outage_s
        start, delay, told = time.monotonic(), 0.25, False
        while True:
            unit = _Try(self)
            yield unit
            if unit.ok:
                return
            waited = time.monotonic() - start
            if waited > limit:
                raise LedgerError(f"the ledger at {self.display_url} did not answer for {waited:.0f} s while "
                                  f"{what}: {unit.error}")
            if warn is not None and not told:
                warn(f"the ledger is not answering ({str(unit.error).splitlines()[0][:160]}); retrying for up to "
                     f"{limit:.0f} s while {what}")
                told = True
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """One unit of work: commits on success, rolls back on any exception."""
        s = self._factory()
        try:
            yield s
            s.commit()
        except BaseException:
            s.rollback()
            raise
        finally:
            s.close()

    def close(self) -> None:
        self.engine.dispose()

    @property
    def display_url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)


def open_ledger(url: str, *, create: bool = True, check: bool = True) -> Ledger:
    """Open the ledger at `url`. A new database is created and migrated when `create`;
    an out-of-date one raises SchemaOutOfDate naming the upgrade command."""
    from campaign.ledger import schema

    parsed = sa.engine.make_url(url) if "://" in url else None
    if (not create and parsed is not None and parsed.drivername.startswith("sqlite") and parsed.database
            and parsed.database != ":memory:" and not Path(parsed.database).exists()):
        raise LedgerError(f"no ledger at {parsed.database}: submit a campaign first (campaign submit FILE), "
                          "or point --db / CAMPAIGN_DB_URL or --workdir at an existing one")
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            current = schema.current_revision(conn)
            empty = current is None and not sa.inspect(conn).get_table_names()
    except sa.exc.OperationalError as e:
        engine.dispose()
        raise LedgerError(f"cannot open the ledger at {engine.url.render_as_string(hide_password=True)}: {e.orig}") from None
    if empty and create:
        schema.upgrade(engine)
    elif check:
        schema.check(engine, current, url)
    return Ledger(url, engine, sessionmaker(engine, expire_on_commit=False))
