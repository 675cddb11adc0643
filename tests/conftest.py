"""Fixtures shared by every test.

* ``pg_admin`` (session): an autocommit psycopg connection to the real PostgreSQL server
  (``CAMPAIGN_TEST_PG``, default ``postgresql://postgres@127.0.0.1:5432/postgres``). If the
  server cannot be reached the test FAILS with the reason and the command that starts it:
  a ledger suite that silently skips Postgres proves nothing.
* ``pg_url`` (session): a throwaway database ``campaign_test_<random>``, dropped at the end.
* ``new_pg_url`` (function): a factory of more throwaway databases (0.1-1 s each).
* ``ledger_url`` (function, parametrized ``sqlite`` / ``postgres``): a URL of a database
  that holds nothing yet. SQLite: a file under ``tmp_path``. Postgres: one throwaway
  database per test module, emptied before each test (its ``public`` schema dropped and
  recreated, other connections to it terminated first), which is much cheaper than
  CREATE DATABASE per test.
* ``run_cli`` (function): ``run_cli("status", "--json", ..., input=None) -> (code, stdout, stderr)``;
  in-process through click's CliRunner by default, or ``subprocess=True`` for a real
  ``python -m campaign.cli`` process. CAMPAIGN_DB_URL / CAMPAIGN_WORKDIR are cleared.
* ``lease_holder`` (function): ``lease_holder(url, name, create=False) -> Popen``: a real
  process that holds campaign ``name``'s driver lease (creating the campaign first if asked)
  and, on SIGTERM, records it ``cancelled``, drops the lease and exits 0, as a driver does.
  Killed at the end of the test if still alive.

Parallel runs (`make test` runs pytest-xdist, `-n 2 --dist loadgroup`): the tests of one
shared stand-in of this machine run on one worker, one at a time (``SHARED_STAND_INS``).
The Slurm cluster's 4 nodes serve one test's jobs at a time, and its start apt-gets
packages; two PBS emulators hand out the same job ids (1000, 1001, ...), so the same
PBS_JOBID, and an emulator signals every process tagged with its job's id. The groups go
by file, through xdist's scheduler hook, because pytest 9.2 ignores the nodeid suffix that
xdist 3.8's `xdist_group` mark relies on; a collection check fails any test that uses a
stand-in's fixture from a file outside its group.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
PG_ADMIN_URL = os.environ.get("CAMPAIGN_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
PG_START = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"
_CAMPAIGN_ENV = ("CAMPAIGN_DB_URL", "CAMPAIGN_WORKDIR")

CliResult = tuple[int, str, str]

# group -> (the fixture of the stand-in, the test files that use it: all run on one xdist worker)
SHARED_STAND_INS = {
    "slurm": ("slurm_cluster", ("tests/hpc/test_infra_slurm.py", "tests/hpc/test_slurm_site.py",
                                "tests/hpc/test_slurm_faults.py")),
    "pbs": ("pbs_emulator", ("tests/hpc/test_infra_pbs.py", "tests/hpc/test_pbs_site.py")),
}


def stand_in_group(nodeid: str) -> str | None:
    path = nodeid.split("::", 1)[0]
    return next((group for group, (_, files) in SHARED_STAND_INS.items() if path in files), None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `--dist loadgroup`: xdist's scheduler, with each shared stand-in's files as one
    unit of work (scheduled first: units go largest first) and every other test its own."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class SharedStandIns(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return stand_in_group(nodeid) or super()._split_scope(nodeid)

    return SharedStandIns(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses a shared stand-in must live in one of its group's files."""
    for item in items:
        here = stand_in_group(item.nodeid)
        for group, (fixture, files) in SHARED_STAND_INS.items():
            if here != group and fixture in getattr(item, "fixturenames", ()):
                raise pytest.UsageError(f"{item.nodeid} uses the {fixture} fixture: add its file to "
                                        f"SHARED_STAND_INS[{group!r}] in tests/conftest.py ({', '.join(files)}), "
                                        "so that parallel workers never share the stand-in")


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[Any]:
    try:
        import psycopg
    except ImportError as e:  # pragma: no cover - the test extra installs it
        pytest.fail(f"psycopg is not installed ({e}); pip install -e '.[test]'", pytrace=False)
    try:
        conn = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as e:
        reason = str(e)
    else:
        reason = ""
    if reason:
        pytest.fail(f"PostgreSQL is unreachable at {PG_ADMIN_URL}: {reason}\nstart it with: {PG_START}", pytrace=False)
    try:
        yield conn
    finally:
        conn.close()


def _admin_base() -> Any:
    import sqlalchemy as sa

    return sa.engine.make_url(PG_ADMIN_URL).set(drivername="postgresql+psycopg")


class _PgDatabases:
    """Creates throwaway databases and drops them (connections terminated first)."""

    def __init__(self, admin: Any) -> None:
        self.admin = admin
        self.names: list[str] = []

    def _execute(self, sql: str, params: Any = None) -> None:
        """Run admin SQL; reconnect once if the server restarted under the connection."""
        import psycopg

        try:
            self.admin.execute(sql, params)
        except psycopg.OperationalError:
            self.admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=10)
            self.admin.execute(sql, params)

    def create(self) -> str:
        name = f"campaign_test_{secrets.token_hex(6)}"
        self._execute(f'CREATE DATABASE "{name}"')
        self.names.append(name)
        return _admin_base().set(database=name).render_as_string(hide_password=False)

    def drop(self, url: str) -> None:
        name = self._disconnect(url)
        self._execute(f'DROP DATABASE IF EXISTS "{name}"')
        self.names.remove(name)

    def empty(self, url: str) -> None:
        """Drop every table, sequence and the Alembic version of the database at `url`."""
        import psycopg

        self._disconnect(url)
        with psycopg.connect(self.admin.info.dsn, dbname=self._name(url), autocommit=True) as conn:
            conn.execute("DROP SCHEMA public CASCADE")
            conn.execute("CREATE SCHEMA public")

    def _disconnect(self, url: str) -> str:
        name = self._name(url)
        self._execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
        return name

    @staticmethod
    def _name(url: str) -> str:
        import sqlalchemy as sa

        return str(sa.engine.make_url(url).database)

    def drop_all(self) -> None:
        for name in list(self.names):
            self.drop(_admin_base().set(database=name).render_as_string(hide_password=False))


@pytest.fixture(scope="session")
def _pg_databases(pg_admin: Any) -> Iterator[_PgDatabases]:
    dbs = _PgDatabases(pg_admin)
    try:
        yield dbs
    finally:
        dbs.drop_all()


@pytest.fixture(scope="session")
def pg_url(_pg_databases: _PgDatabases) -> str:
    """One throwaway database for the whole session (dropped at the end)."""
    return _pg_databases.create()


@pytest.fixture
def new_pg_url(_pg_databases: _PgDatabases) -> Iterator[Callable[[], str]]:
    """A factory of fresh empty databases, each dropped when the test ends."""
    made: list[str] = []

    def make() -> str:
        made.append(_pg_databases.create())
        return made[-1]

    yield make
    for url in made:
        _pg_databases.drop(url)


@pytest.fixture(scope="module")
def _pg_module_url(_pg_databases: _PgDatabases) -> Iterator[str]:
    url = _pg_databases.create()
    yield url
    _pg_databases.drop(url)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty database, once on SQLite and once on the real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    url: str = request.getfixturevalue("_pg_module_url")
    request.getfixturevalue("_pg_databases").empty(url)
    return url


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch) -> Callable[..., CliResult]:
    for var in _CAMPAIGN_ENV:
        monkeypatch.delenv(var, raising=False)

    def run(*args: str | os.PathLike[str], subprocess: bool = False, cwd: str | os.PathLike[str] | None = None,
            env: dict[str, str] | None = None, timeout: float = 60, input: str | None = None) -> CliResult:
        argv = [str(a) for a in args]
        if subprocess:
            return _run_process(argv, cwd, env, timeout, input)
        return _run_in_process(argv, cwd, env, monkeypatch, input)

    return run


def _run_process(argv: list[str], cwd: Any, env: dict[str, str] | None, timeout: float,
                 input: str | None = None) -> CliResult:
    full_env = {k: v for k, v in os.environ.items() if k not in _CAMPAIGN_ENV}
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "campaign.cli", *argv], capture_output=True, text=True,
                          cwd=cwd, env=full_env, timeout=timeout, input=input)
    return proc.returncode, proc.stdout, proc.stderr


def _run_in_process(argv: list[str], cwd: Any, env: dict[str, str] | None, monkeypatch: pytest.MonkeyPatch,
                    input: str | None = None) -> CliResult:
    from click.testing import CliRunner

    from campaign.cli import main

    with monkeypatch.context() as m:
        if cwd is not None:
            m.chdir(cwd)
        result = CliRunner(env=env).invoke(main, argv, catch_exceptions=False, input=input)
    return result.exit_code, result.stdout, result.stderr


_LEASE_HOLDER = """
import os, signal, socket, sys, time
from campaign.ledger import open_ledger, reads, writes
url, name, create = sys.argv[1], sys.argv[2], sys.argv[3] == "create"
led = open_ledger(url, create=create)

def stop(*_):
    with led.session() as s:
        c = reads.get_campaign(s, name)
        writes.set_campaign_state(s, c, "cancelled")
        writes.drop_lease(s, c, "tok")
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
with led.session() as s:
    if create:
        c = writes.create_campaign(s, name=name, digest="0" * 64, spec_json={}, source="", site="local", workdir="/w")
        writes.set_campaign_state(s, c, "running")
    else:
        c = reads.get_campaign(s, name)
    writes.take_lease(s, c, host=socket.gethostname(), pid=os.getpid(), token="tok", ttl_s=60)
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def lease_holder() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []

    def hold(url: str, name: str, *, create: bool = False) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, "-c", _LEASE_HOLDER, url, name, "create" if create else "open"],
                             stdout=subprocess.PIPE, text=True, cwd=REPO)
        started.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        return p

    yield hold
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()
