"""Opening the ledger: engines, SQLite PRAGMAs, schema checks, and `session_scope()`.

    ledger = open_ledger("sqlite:///campaigns/ledger.db")   # created and migrated if new
    with ledger.session() as s:                               # commits, or rolls back on error
        reads.get_campaign(s, "demo")

A new (empty) database is migrated to the head revision on first use. A database at an
older revision is refused with the command that upgrades it; nothing is changed.
"""

from __future__ import annotations

import contextlib
import logging
import errno
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from campaign.errors import DiskFull, LeaseLost, LedgerError, NoLedger

logger = logging.getLogger(__name__)

COMMITTED_EVENTS = "campaign.events"
"""Key of `Session.info` under which `writes.add_event` keeps, for each event a unit of work
adds, a function that makes its record; `Ledger.session` calls them after the commit (the
rows have their ids then) and hands the records to its listeners."""


def default_url(workdir: str | Path) -> str:
    """The ledger a user gets with no configuration: SQLite inside the work directory."""
    return os.environ.get("CAMPAIGN_DB_URL") or f"sqlite:///{Path(workdir).resolve() / 'ledger.db'}"


BUSY_S = float(os.environ.get("CAMPAIGN_LEDGER_BUSY_S", "10"))
"""How long a SQLite connection waits for another's lock before it says 'database is locked'
(each try of a unit of work; `Ledger.retrying` tries again up to CAMPAIGN_LEDGER_OUTAGE_S)."""


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    # A reader that meets a checkpointing writer waits instead of failing at once.
    cur.execute(f"PRAGMA busy_timeout={int(BUSY_S * 1000)}")
    # WAL: readers (`campaign status`) never block the single writer (the driver).
    _enter_wal(cur)
    # Foreign keys are off by default in SQLite; the schema relies on them for cascades.
    cur.execute("PRAGMA foreign_keys=ON")
    # WAL with NORMAL survives a process crash (not a power loss) and is much faster.
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def _enter_wal(cur: Any) -> None:
    """`PRAGMA journal_mode=WAL`, waiting out another connection's write lock. A database not
    yet in WAL (a new ledger) is switched under a read lock raised to a write lock, and SQLite
    does not call the busy handler for that raise (it could deadlock): it fails at once with
    'database is locked'. Two drivers opening a new ledger together met that; so the switch
    is tried again, with backoff, for as long as the busy timeout would have waited."""
    deadline, delay = time.monotonic() + BUSY_S, 0.005
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except Exception as e:  # the DBAPI's OperationalError: 'database is locked' is transient
            if not transient(e) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.25)


def make_engine(url: str) -> sa.Engine:
    """An engine for `url`; SQLite files get their directory created and their PRAGMAs set."""
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        raise LedgerError(f"not a database URL: {url!r} (expected e.g. sqlite:///path/ledger.db or postgresql+psycopg://host/db)") from None
    if parsed.drivername.startswith("sqlite"):
        if parsed.database and parsed.database != ":memory:":
            try:
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise LedgerError(f"cannot make the ledger's folder {Path(parsed.database).parent}: "
                                  f"{e.strerror or e}") from None
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


_FULL = ("database or disk is full", "no space left on device", "disk quota exceeded")

RESERVE_BYTES = 2 * 1024 * 1024
"""The driver keeps this much of the SQLite ledger's file system for its last writes
(`Ledger.keep_reserve`): the attempt's end, the stage's and campaign's state, the lease's release."""


def disk_full(e: BaseException) -> bool:
    """Whether an error says the file system is full (ENOSPC, EDQUOT; SQLite's SQLITE_FULL)."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(e.orig if isinstance(e, sa.exc.DBAPIError) else e).lower()
    return any(t in text for t in _FULL)


def _sleep(seconds: float, interrupted: Callable[[], BaseException | None] | None) -> None:
    """Sleep, but raise what `interrupted()` returns as soon as it returns something."""
    end = time.monotonic() + seconds
    while True:
        stop = interrupted() if interrupted is not None else None
        if stop is not None:
            raise stop
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.1))


class _Try:
    """One try of a unit of work (see `Ledger.retrying`): a session that commits, and
    swallows a transient error so the loop can try again."""

    def __init__(self, ledger: Ledger, *, fenced: bool = True, what: str | None = None) -> None:
        self.ledger, self.ok, self.error, self.fenced, self.what = ledger, False, None, fenced, what
        self._cm: Any = None

    def __enter__(self) -> Session:
        self._cm = self.ledger.session(fenced=self.fenced)  # a Session connects lazily: opening it cannot fail
        return self._cm.__enter__()  # type: ignore[no-any-return]

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:
        try:
            self._cm.__exit__(kind, value, tb)  # commits, or rolls back and re-raises
        except DiskFull as e:
            if not self.ledger.release_reserve():  # only while the driver records its stop
                raise self.ledger.disk_full_error(getattr(e, "cause", e), self.what) from None
            self.error = e  # the reserve made room: again
            return True
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
    fence: tuple[int, str] | None = None
    """(campaign id, lease token) while a driver holds a campaign's lease (`DriverLease`):
    every unit of work then checks, in its own transaction, that the token still holds the
    lease, and commits nothing if it does not (a fencing token)."""
    listeners: list[Callable[[list[dict[str, Any]]], None]] = field(default_factory=list)
    """Called after each commit with the records of the events that unit of work added
    (`writes.add_event`; the driver's observers: TensorBoard, W&B, notifications). A
    listener must not raise (one that does is logged): the commit has happened, and the
    unit of work must not be tried again."""
    closing: bool = False
    """Set by a driver that stops on a full disk (`DiskFull`): a write that finds the disk full
    then releases the reserve (`keep_reserve`) and tries again, once."""

    def retrying(self, what: str, *, outage_s: float | None = None,
                 warn: Callable[[str], None] | None = None, fenced: bool = True,
                 interrupted: Callable[[], BaseException | None] | None = None) -> Iterator[_Try]:
        """A unit of work that outlives a ledger outage (the driver's writes use it):

            for unit in ledger.retrying("recording the attempt"):
                with unit as s:
                    ...                      # re-run from the start after a transient error

        Retries with backoff (0.25 s doubling to 5 s) for up to `outage_s` (default OUTAGE_S),
        telling `warn` once; then raises LedgerError naming the ledger and what was being done.
        A non-transient error is raised at once. Nothing is lost meanwhile: the trainer's
        metrics.jsonl is the source, ingested again once the ledger answers. `interrupted()`,
        asked between tries and while waiting, returns an exception to stop with (Ctrl-C
        during an outage: the driver stops within a try, not after the outage)."""
        limit = OUTAGE_S if outage_s is None else outage_s
        start, delay, told = time.monotonic(), 0.25, False
        while True:
            unit = _Try(self, fenced=fenced, what=what)
            yield unit
            if unit.ok:
                return
            if isinstance(unit.error, DiskFull):
                continue  # the reserve was released (`closing`): room for this write now
            waited = time.monotonic() - start
            if waited > limit:
                raise LedgerError(f"the ledger at {self.display_url} did not answer for {waited:.0f} s while "
                                  f"{what}: {unit.error}")
            if warn is not None and not told:
                warn(f"the ledger is not answering ({str(unit.error).splitlines()[0][:160]}); retrying for up to "
                     f"{limit:.0f} s while {what}")
                told = True
            _sleep(delay, interrupted)
            delay = min(delay * 2, 5.0)

    @property
    def sqlite_path(self) -> Path | None:
        """The SQLite ledger's file (its companions `-wal`, `-shm`, `-journal`, `.lock` and
        `.reserve` beside it); None for Postgres or in memory."""
        url = self.engine.url
        if not url.drivername.startswith("sqlite") or not url.database or url.database == ":memory:":
            return None
        return Path(url.database).resolve()

    @property
    def reserve_path(self) -> Path | None:
        """`<ledger>.reserve` beside a SQLite ledger file; None for Postgres or in memory."""
        path = self.sqlite_path
        return None if path is None else path.with_name(path.name + ".reserve")

    def keep_reserve(self) -> None:
        """Keep RESERVE_BYTES of the SQLite ledger's file system for a driver's last writes: a
        file of zeros (written, not sparse) that `release_reserve` deletes when the disk is
        full. Where there is no room for it now, nothing (the driver will meet the full disk)."""
        path = self.reserve_path
        if path is None or (path.exists() and path.stat().st_size >= RESERVE_BYTES):
            return
        try:
            with open(path, "wb") as f:
                for _ in range(RESERVE_BYTES // 65536):
                    f.write(bytes(65536))
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            with contextlib.suppress(OSError):
                path.unlink()

    def release_reserve(self) -> bool:
        """While `closing`: delete the reserve so the next write has room; whether it did."""
        path = self.reserve_path
        if not self.closing or path is None:
            return False
        try:
            path.unlink()
        except OSError:
            return False
        return True

    def disk_full_error(self, e: BaseException, what: str | None = None) -> DiskFull:
        """The one line for a write that met a full disk (while doing `what`)."""
        where = f"in {self.reserve_path.parent}" if self.reserve_path is not None else "on the database server"
        cause = e.orig if isinstance(e, sa.exc.DBAPIError) else e
        full = DiskFull(f"the ledger at {self.display_url} cannot be written{f' while {what}' if what else ''}: "
                        f"its file system is full ({cause}); free space {where}, then `campaign resume` continues")
        full.cause = cause  # type: ignore[attr-defined]
        return full

    @contextlib.contextmanager
    def session(self, *, fenced: bool = True) -> Iterator[Session]:
        """One unit of work: commits on success, rolls back on any exception. Under a lease
        (`fence`), and unless `fenced` is false (the lease's own renewals), it first checks
        the lease in the same transaction and raises LeaseLost instead of committing a write
        of a driver that another one displaced."""
        s = self._factory()
        try:
            yield s
            if fenced and self.fence is not None:
                _check_fence(s, *self.fence)
            s.commit()
            made = s.info.pop(COMMITTED_EVENTS, ())
        except BaseException as e:
            s.rollback()
            if isinstance(e, Exception) and not isinstance(e, DiskFull) and disk_full(e):
                raise self.disk_full_error(e) from None
            broken = explain(e, self.engine) if isinstance(e, Exception) and not transient(e) else None
            if broken is not None:
                raise broken from e
            raise
        finally:
            s.close()
        self._tell(made)  # after the commit, outside it: nothing here can roll back or retry the unit

    def _tell(self, made: Sequence[Callable[[], dict[str, Any]]]) -> None:
        if not made or not self.listeners:
            return
        try:
            events = [m() for m in made]
        except Exception:  # noqa: BLE001 - as below: the commit stands
            logger.exception("the records of %d committed event(s) could not be made", len(made))
            return
        for listener in list(self.listeners):
            try:
                listener(events)
            except Exception:  # noqa: BLE001 - committed already: never make the unit of work fail or retry
                logger.exception("a ledger listener failed on %d event(s)", len(events))

    def close(self) -> None:
        self.engine.dispose()

    @property
    def display_url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def check_integrity(self) -> None:
        """Raise a one-line LedgerError when a SQLite ledger fails `PRAGMA quick_check` (pages
        that the open and the schema check never read may be bad: a driver must not build on
        them). Postgres keeps its own checksums: nothing to do there."""
        if self.engine.dialect.name != "sqlite":
            return
        try:
            with self.engine.connect() as conn:
                found = [str(r[0]) for r in conn.exec_driver_sql("PRAGMA quick_check(5)")]
        except sa.exc.DBAPIError as e:  # so bad that the check itself stops
            found = [str(e.orig)]
        if found != ["ok"]:
            raise LedgerError(f"the ledger at {self.display_url} fails PRAGMA quick_check ({found[0]}): restore it "
                              "from a backup, or point --db / --workdir at another one")


_FENCE = sa.text("UPDATE lease SET token = token WHERE campaign_id = :campaign AND token = :token")
"""Touches the lease row only if this driver's token still holds it: in the unit of work's
own transaction, so a take-over either committed before (0 rows: nothing is written) or waits
for this transaction (the row's lock) and sees its writes as the old holder's last."""


def _check_fence(s: Session, campaign_id: int, token: str) -> None:
    if s.execute(_FENCE, {"campaign": campaign_id, "token": token}).rowcount == 1:
        return
    holder = s.execute(sa.text("SELECT pid, host FROM lease WHERE campaign_id = :c"), {"c": campaign_id}).first()
    who = f"pid {holder[0]} on {holder[1]} took over this campaign's lease" if holder else \
        "this campaign's lease was removed"
    raise LeaseLost(f"{who}; this driver's write was not committed (fencing): it stops and leaves the running "
                    "launch to the new driver")


def open_ledger(url: str, *, create: bool = True, check: bool = True) -> Ledger:
    """Open the ledger at `url`. A new database is created and migrated when `create`
    (one process at a time: `schema_lock`); an out-of-date one raises SchemaOutOfDate
    naming the upgrade command; a corrupt or unreadable one a one-line LedgerError."""
    parsed = sa.engine.make_url(url) if "://" in url else None
    if (not create and parsed is not None and parsed.drivername.startswith("sqlite") and parsed.database
            and parsed.database != ":memory:" and not Path(parsed.database).exists()):
        raise NoLedger(f"no ledger at {parsed.database}: submit a campaign first (campaign submit FILE), "
                          "or point --db / CAMPAIGN_DB_URL or --workdir at an existing one")
    engine = make_engine(url)
    try:
        _prepare_schema(engine, url, create=create, check=check)
    except BaseException:
        engine.dispose()
        raise
    return Ledger(url, engine, sessionmaker(engine, expire_on_commit=False))


def _prepare_schema(engine: sa.Engine, url: str, *, create: bool, check: bool) -> None:
    """Create a new ledger's schema, or check an existing one's revision. A ledger not at
    this release's head is looked at again under `schema_lock`: two drivers starting on a
    fresh ledger neither both create its tables nor see the other's half-made schema."""
    from campaign.ledger import schema

    current, empty = revision(engine)
    if current != schema.head_revision():  # new, being created by another process, or out of date
        with schema_lock(engine):
            current, empty = revision(engine)
            if empty and create:
                create_schema(engine)
                return
    if check:
        schema.check(engine, current, url)


def create_schema(engine: sa.Engine) -> None:
    """Migrate a new, empty ledger to this release's head in one transaction: a failure part
    way (a full disk) leaves it empty, created again by the next open, instead of some tables
    and no revision, which only deleting the file mended ("at schema revision (none) ...
    upgrade it", and the upgrade met the half-made tables). Postgres' DDL is transactional
    already. pysqlite runs DDL outside the transaction it reports, so SQLite gets an engine of
    its own with the driver in autocommit and BEGIN emitted by SQLAlchemy (its documented
    recipe for pysqlite), used for the creation only: inside that transaction `PRAGMA
    foreign_keys` cannot be switched off for batch migrations, harmless on empty tables but
    not for `campaign db upgrade` of a ledger with rows. A full disk is told in one line
    (`DiskFull`), the folder named."""
    from campaign.ledger import schema

    own = engine
    if engine.dialect.name == "sqlite" and engine.url.database not in (None, "", ":memory:"):
        # (a second engine on ":memory:" would open another, empty database)
        own = sa.create_engine(engine.url, poolclass=sa.pool.NullPool)
        sa.event.listen(own, "connect", _sqlite_pragmas)
        sa.event.listen(own, "connect", lambda dbapi_conn, _record: setattr(dbapi_conn, "isolation_level", None))
        sa.event.listen(own, "begin", lambda conn: conn.exec_driver_sql("BEGIN"))
    try:
        schema.upgrade(own, one_transaction=True)
    except sa.exc.DBAPIError as e:
        if disk_full(e):
            raise DiskFull(f"cannot create the ledger at {_shown(engine)}: {e.orig}{_full(engine)}; nothing was "
                           "written, submit again once there is room") from None
        raise explain(e, engine) or LedgerError(
            f"cannot create the ledger at {_shown(engine)}: {e.orig}{_full(engine)}") from None
    finally:
        if own is not engine:
            own.dispose()


def revision(engine: sa.Engine) -> tuple[str | None, bool]:
    """The ledger's schema revision, and whether the database holds no table at all."""
    from campaign.ledger import schema

    try:
        with engine.connect() as conn:
            current = schema.current_revision(conn)
            return current, current is None and not sa.inspect(conn).get_table_names()
    except sa.exc.DBAPIError as e:
        raise explain(e, engine) or LedgerError(
            f"cannot open the ledger at {_shown(engine)}: {e.orig}{_full(engine)}") from None


SCHEMA_LOCK_KEY = 0x63616D70
"""The Postgres advisory lock (per database) held while the ledger's schema is created or upgraded."""


@contextlib.contextmanager
def schema_lock(engine: sa.Engine) -> Iterator[None]:
    """Hold the ledger's schema lock: on Postgres an advisory lock (`pg_advisory_lock`) for
    the database, on SQLite an exclusive `flock` of `LEDGER.lock` next to the file. Held by
    one process at a time, for schema creation and `campaign db upgrade`."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.exec_driver_sql(f"SELECT pg_advisory_lock({SCHEMA_LOCK_KEY})")
            try:
                yield
            finally:
                conn.exec_driver_sql(f"SELECT pg_advisory_unlock({SCHEMA_LOCK_KEY})")
        return
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:":
        yield
        return
    import fcntl

    try:
        lock = open(f"{database}.lock", "a")  # noqa: SIM115 (closed below)
    except OSError:  # a read-only folder: nobody can create the schema there either
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


_BROKEN = (
    ("file is not a database", "is not a SQLite database (a corrupt file, or another kind of file)", "restore it"),
    ("database disk image is malformed", "is corrupt or truncated (database disk image is malformed)", "restore it"),
    ("attempt to write a readonly database", "is read-only (attempt to write a readonly database)", "make it writable"),
    ("unable to open database file", "cannot be opened (unable to open database file)", "check its folder"),
)
"""(what the database says, what it means, what to do) for errors no retry cures."""


def explain(e: BaseException, engine: sa.Engine) -> LedgerError | None:
    """A one-line LedgerError, naming the ledger, for a database error that no retry cures
    and a user can act on (a corrupt, truncated or read-only ledger); None for others."""
    text = str(e.orig if isinstance(e, sa.exc.DBAPIError) else e).lower()
    for needle, what, todo in _BROKEN:
        if needle in text:
            return LedgerError(f"the ledger at {_shown(engine)} {what}: {todo}, or point --db / --workdir at another one")
    return None


@contextlib.contextmanager
def explained(engine: sa.Engine) -> Iterator[None]:
    """Database errors inside become one-line LedgerErrors naming the ledger (`explain`)."""
    try:
        yield
    except sa.exc.DBAPIError as e:
        raise explain(e, engine) or LedgerError(
            f"cannot use the ledger at {_shown(engine)}: {e.orig}{_full(engine)}") from None


def _full(engine: sa.Engine) -> str:
    """'; its file system is full: free space in DIR' where the SQLite ledger's file system has
    no room left (SQLite says 'disk I/O error' when it cannot even map its -shm file), else ''."""
    db = engine.url.database if engine.url.drivername.startswith("sqlite") else None
    if not db or db == ":memory:":
        return ""
    try:
        st = os.statvfs(Path(db).parent)
    except OSError:
        return ""
    return f"; its file system is full: free space in {Path(db).parent}" if st.f_bavail * st.f_frsize < 65536 else ""


def _shown(engine: sa.Engine) -> str:
    return engine.url.render_as_string(hide_password=True)
