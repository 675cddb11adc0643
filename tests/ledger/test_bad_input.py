"""Bad ledgers, work directories, reference files and names, through the real CLI: each
gives one line naming the file or field, exit 2, no traceback, and leaves the ledger (and
an existing --out file) as it was. And two drivers starting on a fresh ledger do not race
each other into creating its schema (SQLite and the real PostgreSQL, separate processes)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from campaign.ledger import open_ledger, reads, writes

REPO = Path(__file__).resolve().parents[2]
TINY = {"name": "tiny", "site": {"kind": "local", "nodes": 1, "ranks_per_node": 1}, "model": {"size": "tiny"},
        "trainer": {"micro_batch_size": 2, "warmup_steps": 2}, "stages": [{"name": "smoke", "kind": "smoke", "steps": 2}]}
# Root ignores file modes; without CAP_DAC_OVERRIDE (dropped by setpriv) it honours them, as a user would.
AS_USER = (["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]
           if os.geteuid() == 0 and shutil.which("setpriv") else [])


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _spec(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY, **changes}, sort_keys=False))
    return path


def _cli(*argv: object, cwd: Path | None = None, prefix: list[str] | None = None) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CAMPAIGN_DB_URL", "CAMPAIGN_WORKDIR")}
    p = subprocess.run([*(prefix or []), sys.executable, "-m", "campaign.cli", *map(str, argv)], capture_output=True,
                       text=True, cwd=cwd, env=env, timeout=300)
    return p.returncode, p.stdout, p.stderr


def _one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


def _ledger_with_a_campaign(path: Path, steps: int = 50) -> None:
    led = open_ledger(f"sqlite:///{path}")
    with led.session() as s:
        c = writes.create_campaign(s, name="big", digest="0" * 64, spec_json={}, source="", site="local", workdir="/w")
        (run,) = writes.ensure_stage_runs(s, c, [("long", "long_run")])
        a = writes.create_attempt(s, run, nodes=["n0"], ranks_per_node=1, run_dir="/w/a")
        writes.ingest_steps(s, a, [{"step": i, "tokens": 100 * i, "loss": 1.0 / i, "step_time_s": 0.1, "lr": 1e-3}
                                   for i in range(1, steps + 1)])
    with led.engine.connect() as conn:  # one file is the whole ledger
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    led.close()


# --- a corrupt, truncated or read-only ledger ---------------------------------------------

BROKEN = {
    "not-a-database": ("is not a SQLite database", lambda p: p.write_bytes(b"this is not a ledger\n" * 500)),
    "truncated": ("is corrupt or truncated", lambda p: (_ledger_with_a_campaign(p), os.truncate(p, p.stat().st_size // 2))),
}


@pytest.mark.parametrize("kind", BROKEN)
def test_a_broken_ledger_is_named_and_left_as_it_was(kind: str, tmp_path: Path) -> None:
    what, make = BROKEN[kind]
    wd = tmp_path / "wd"
    wd.mkdir()
    db = wd / "ledger.db"
    make(db)
    before = _sha(db)
    spec = _spec(tmp_path)
    out = tmp_path / "steps.csv"
    for argv in (["status"], ["status", "big", "--json"], ["ledger", "export", "big", "--out", out], ["submit", spec],
                 ["db", "current"], ["db", "upgrade"]):
        code, stdout, err = _cli(*argv, "--workdir", wd)
        _one_line_error(code, err, f"the ledger at sqlite:///{db} {what}")
        assert _sha(db) == before, argv
    assert not out.exists() and not (wd / "tiny").exists()


def test_export_of_a_ledger_that_breaks_midway_writes_nothing(tmp_path: Path) -> None:
    """Pages of the ledger go bad after the first export page was written: the --out file
    that was there stays as it was, and no temporary file is left behind."""
    wd = tmp_path / "wd"
    wd.mkdir()
    db = wd / "ledger.db"
    _ledger_with_a_campaign(db, steps=60_000)
    with db.open("r+b") as f:  # four pages of garbage at 60 % of the file: step rows of the second page
        f.seek(db.stat().st_size * 6 // 10 // 4096 * 4096)
        f.write(b"\xa5" * 4 * 4096)
    out = tmp_path / "steps.csv"
    out.write_text("an earlier export\n")
    code, stdout, err = _cli("ledger", "export", "big", "--workdir", wd, "--out", out)
    _one_line_error(code, err, f"the ledger at sqlite:///{db} is corrupt")
    assert out.read_text() == "an earlier export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.csv", "wd"], "no temporary file left"


def test_resume_refuses_a_ledger_that_fails_quick_check(tmp_path: Path) -> None:
    """Issue 30, item 4: bad pages deep in the step rows, which opening the ledger and
    reading the campaign never touch: `resume` runs `PRAGMA quick_check` first and refuses."""
    wd = tmp_path / "wd"
    wd.mkdir()
    db = wd / "ledger.db"
    _ledger_with_a_campaign(db, steps=20_000)
    with db.open("r+b") as f:  # four pages of garbage at 60 % of the file: step rows
        f.seek(db.stat().st_size * 6 // 10 // 4096 * 4096)
        f.write(b"\xa5" * 4 * 4096)
    before = _sha(db)
    code, stdout, err = _cli("resume", "big", "--workdir", wd)
    _one_line_error(code, err, f"the ledger at sqlite:///{db} fails PRAGMA quick_check")
    assert _sha(db) == before


@pytest.mark.skipif(os.geteuid() == 0 and not AS_USER, reason="root without setpriv cannot be refused a write")
def test_submit_to_a_read_only_ledger(tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    db = wd / "ledger.db"
    _ledger_with_a_campaign(db)
    db.chmod(0o444)
    before = _sha(db)
    code, out, err = _cli("submit", _spec(tmp_path), "--workdir", wd, prefix=AS_USER)
    _one_line_error(code, err, f"the ledger at sqlite:///{db} is read-only")
    assert _sha(db) == before and not (wd / "tiny").exists()
    db.chmod(0o644)
    led = open_ledger(f"sqlite:///{db}", create=False)
    with led.session() as s:
        assert [c.name for c in reads.list_campaigns(s)] == ["big"]
    led.close()


# --- an unusable --workdir ----------------------------------------------------------------

def test_a_workdir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    db = tmp_path / "db" / "ledger.db"
    for wd in ("afile", "afile/sub"):
        code, out, err = _cli("submit", _spec(tmp_path), "--workdir", wd, "--db", f"sqlite:///{db}", cwd=tmp_path)
        _one_line_error(code, err, f"--workdir {wd}: ")
    assert not db.parent.exists(), "no ledger was made"


@pytest.mark.skipif(os.geteuid() == 0 and not AS_USER, reason="root without setpriv can write anywhere")
def test_a_workdir_that_cannot_be_written(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    db = tmp_path / "db" / "ledger.db"
    for wd in (locked, locked / "sub"):
        code, out, err = _cli("submit", _spec(tmp_path), "--workdir", wd, "--db", f"sqlite:///{db}", prefix=AS_USER)
        _one_line_error(code, err, f"--workdir {wd}: cannot write there (Permission denied)")
    assert not db.parent.exists() and list(locked.iterdir()) == []


# --- a binary reference file --------------------------------------------------------------

@pytest.fixture
def binary(tmp_path: Path) -> Path:
    path = tmp_path / "ref.csv"
    path.write_bytes(b"step,loss\n1,4.0\n" + bytes(range(128, 256)) + b"\n")
    return path


def test_import_reference_of_a_binary_file(tmp_path: Path, binary: Path) -> None:
    code, out, err = _cli("ledger", "import-reference", "ref", binary, "--workdir", tmp_path / "wd")
    assert code == 2 and "Traceback" not in err, err
    assert f"{binary}: 1 problem" in err and "not a text file: byte 0x80 at offset 16 is not UTF-8" in err
    assert not (tmp_path / "wd").exists()


def test_loss_check_with_a_binary_reference_is_refused_before_submission(tmp_path: Path, binary: Path) -> None:
    stage = {"name": "lc", "kind": "loss_check", "steps": 5, "window": 2, "reference": {"file": binary.name}}
    code, out, err = _cli("submit", _spec(tmp_path, stages=[stage]), "--workdir", tmp_path / "wd")
    assert code == 2 and "Traceback" not in err, err
    assert f"stages[0].reference.file: {binary}: not a text file" in err  # the preflight's line
    assert not (tmp_path / "wd").exists()


# --- names too long for the ledger, refused before Postgres sees them ----------------------

@pytest.mark.postgres
def test_names_too_long_never_reach_postgres(tmp_path: Path, new_pg_url: Callable[[], str]) -> None:
    url = new_pg_url()
    long = "a" * 70
    cases = {
        "name": _spec(tmp_path, name=long),
        "stages[0].name": _spec(tmp_path, stages=[{"name": long, "kind": "smoke", "steps": 2}]),
    }
    for field, spec in cases.items():
        code, out, err = _cli("submit", spec, "--db", url, "--workdir", tmp_path / "wd")
        assert code == 2 and "Traceback" not in err, err
        assert f"{field}: '{long}' is 70 characters long; the ledger keeps names of at most 64 characters" in err
    code, out, err = _cli("nodes", "exclude", "n" * 200, "--site", "local", "--reason", "x", "--db", url)
    _one_line_error(code, err, "NODE: 'nnnnnnnnnnnnnnnnnnnnnnnn'... is 200 characters long; the ledger keeps at most 128")
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        assert sa.inspect(conn).get_table_names() == [], "the database was never touched"
    engine.dispose()


# --- drivers starting together on a fresh ledger -------------------------------------------

def _together(argvs: list[list[object]], cwd: Path) -> list[tuple[int, str]]:
    env = {k: v for k, v in os.environ.items() if k not in ("CAMPAIGN_DB_URL", "CAMPAIGN_WORKDIR")}
    procs = [subprocess.Popen([sys.executable, "-m", "campaign.cli", *map(str, a)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=cwd, env=env) for a in argvs]
    return [(p.wait(timeout=300), p.communicate()[1]) for p in procs]


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_four_processes_create_a_fresh_ledger_once(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}" if backend == "sqlite" else request.getfixturevalue("new_pg_url")()
    results = _together([["nodes", "exclude", f"n{i}", "--site", "local", "--reason", "race", "--db", url]
                         for i in range(4)], tmp_path)
    assert [code for code, _ in results] == [0, 0, 0, 0], [err for _, err in results]
    led = open_ledger(url, create=False)
    with led.session() as s:
        assert sorted(e.node for e in reads.list_exclusions(s, "local")) == ["n0", "n1", "n2", "n3"]
    led.close()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_two_submits_on_a_fresh_ledger(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Both create the schema, then the campaign, at the same moment: one drives it; the
    other is refused by the lease (or, if it came later, finds every stage passed)."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}" if backend == "sqlite" else request.getfixturevalue("new_pg_url")()
    spec = _spec(tmp_path)
    results = _together([["submit", spec, "--db", url, "--workdir", tmp_path / "wd", "-q"]] * 2, tmp_path)
    codes = sorted(code for code, _ in results)
    assert codes in ([0, 0], [0, 2]), results
    for code, err in results:
        assert "Traceback" not in err and "already exists" not in err and "upgrade" not in err, err
        if code == 2:
            assert "campaign 'tiny' is being driven by pid" in err or "another driver took the lease" in err, err
    led = open_ledger(url, create=False)
    with led.session() as s:
        c = reads.get_campaign(s, "tiny")
        assert c is not None and c.state == "succeeded" and len(reads.list_attempts(s, c)) == 1
    led.close()


# --- a full disk and names that collide (issue 39, item 4) ------------------------------------

def _fill(folder: Path) -> None:
    with open(folder / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


@pytest.fixture
def tmpfs(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A real tmpfs of 1 MiB (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mnt = tmp_path / "full"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True, capture_output=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def full_disk(tmpfs: Path) -> Path:
    """The tmpfs filled to the last byte by someone else's file."""
    _fill(tmpfs)
    return tmpfs


def test_commands_on_a_ledger_whose_disk_is_full_say_so_in_one_line(tmpfs: Path) -> None:
    """An existing ledger, then the disk fills: every command that writes it ends in one line
    that says the file system is full (SQLite itself says only 'disk I/O error' when it cannot
    map its -shm file), exit 2, the ledger as it was."""
    _ledger_with_a_campaign(tmpfs / "ledger.db")
    before = _sha(tmpfs / "ledger.db")
    _fill(tmpfs)
    for argv in (["nodes", "exclude", "n1", "--site", "local", "--reason", "x"], ["resume", "big"], ["db", "upgrade"]):
        code, _, err = _cli(*argv, "--workdir", tmpfs)
        _one_line_error(code, err, "its file system is full", str(tmpfs))
        assert _sha(tmpfs / "ledger.db") == before, argv


def test_a_first_submit_onto_a_disk_that_fills_while_the_ledger_is_created_leaves_it_empty(
        tmp_path: Path, tmpfs: Path) -> None:
    """A new ledger on a file system with room for part of its schema (here 64 KiB): the first
    submit fails in one line saying the file system is full, and leaves an empty database,
    not some tables and no revision (before: a traceback, then every later command said
    "at schema revision (none) ... upgrade it"). Once there is room, the next open creates it."""
    _fill(tmpfs)
    filler = tmpfs / "filler"
    os.truncate(filler, filler.stat().st_size - 64 * 1024)
    code, _, err = _cli("submit", _spec(tmp_path), "--workdir", tmpfs)
    _one_line_error(code, err, "cannot create the ledger", "its file system is full", str(tmpfs))
    with sa.create_engine(f"sqlite:///{tmpfs / 'ledger.db'}").connect() as conn:
        assert sa.inspect(conn).get_table_names() == [], "no half-made schema"
    # `campaign db upgrade` on that empty ledger, the disk still full: the same one line, still empty.
    code, _, err = _cli("db", "upgrade", "--workdir", tmpfs)
    _one_line_error(code, err, "its file system is full", str(tmpfs))
    with sa.create_engine(f"sqlite:///{tmpfs / 'ledger.db'}").connect() as conn:
        assert sa.inspect(conn).get_table_names() == [], "no half-made schema from db upgrade either"
    filler.unlink()
    from campaign.ledger import schema

    led = open_ledger(f"sqlite:///{tmpfs / 'ledger.db'}")
    with led.engine.connect() as conn:
        assert schema.current_revision(conn) == schema.head_revision()
    code, out, err = _cli("status", "--workdir", tmpfs)
    assert code == 0, err


def test_export_onto_a_full_disk_is_one_line_and_leaves_nothing(tmp_path: Path, full_disk: Path) -> None:
    """`ledger export --out` onto a full disk, and the same export redirected there from
    standard output: one line naming where, exit 2, no traceback, no part file left."""
    wd = tmp_path / "wd"
    wd.mkdir()
    _ledger_with_a_campaign(wd / "ledger.db", steps=20_000)
    out = full_disk / "steps.csv"
    code, _, err = _cli("ledger", "export", "big", "--workdir", wd, "--out", out)
    _one_line_error(code, err, f"--out {out}", "No space left on device")
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"], "no part file left"
    env = {k: v for k, v in os.environ.items() if k not in ("CAMPAIGN_DB_URL", "CAMPAIGN_WORKDIR")}
    with open(out, "w") as shell_redirect:  # campaign ledger export big > /full/steps.csv
        p = subprocess.run([sys.executable, "-m", "campaign.cli", "ledger", "export", "big", "--workdir", str(wd)],
                           stdout=shell_redirect, stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    _one_line_error(p.returncode, p.stderr, "standard output", "No space left on device")


def test_a_campaign_named_like_the_ledger_file_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """`name: ledger.db` would put the campaign's folder where the ledger is (and `ledger.db-wal`,
    `ledger.db.lock` beside it): refused with one line naming the field, the ledger untouched."""
    wd = tmp_path / "wd"
    wd.mkdir()
    _ledger_with_a_campaign(wd / "ledger.db")
    before = _sha(wd / "ledger.db")
    for name in ("ledger.db", "ledger.db-wal", "ledger.db.lock"):
        code, _, err = _cli("submit", _spec(tmp_path, name=name), "--workdir", wd)
        _one_line_error(code, err, name, "ledger")
        assert _sha(wd / "ledger.db") == before
        assert sorted(p.name for p in wd.iterdir() if p.is_dir()) == []


def test_an_in_memory_ledger_is_created_with_its_tables() -> None:
    """The one-transaction creation (a second engine) must not open a second in-memory
    database: `sqlite:///:memory:` got no tables after ad56c2c (found by review)."""
    from campaign.ledger import schema

    led = open_ledger("sqlite:///:memory:")
    with led.engine.connect() as conn:
        assert "campaign" in sa.inspect(conn).get_table_names()
        assert schema.current_revision(conn) == schema.head_revision()
