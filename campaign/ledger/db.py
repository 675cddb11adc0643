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
from collections.abc import Iterator
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


@dataclass
class Ledger:
    """An open ledger: its URL, engine and session factory."""

    url: str
    engine: sa.Engine
    _factory: sessionmaker[Session]

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
