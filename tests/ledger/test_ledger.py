"""The ledger contract, on SQLite and on the real PostgreSQL: creation and migration,
campaigns and stage runs, idempotent metric ingestion, exclusions, events, the Alembic
tree (one head, downgrade/upgrade round trips) and the refusal of out-of-date schemas."""

from __future__ import annotations

import datetime as dt
import json
import math
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from campaign import goodput
from campaign.errors import LedgerError, SchemaOutOfDate
from campaign.ledger import Ledger, open_ledger, reads, schema, writes
from campaign.ledger import db as ledger_db
from campaign.ledger.db import make_engine
from campaign.ledger.models import Attempt, Base, StepMetric, utcnow
from campaign.summary import summarize_campaign

GOODPUT_LOST = ("startup_s", "checkpoint_stall_s", "recomputed_s", "detection_s", "restart_s", "other_s")
TABLES = {"campaign", "stage_run", "attempt", "step_metric", "checkpoint", "exclusion", "event"}


def _revisions() -> list[str]:
    """Every revision, oldest first (the tree must be linear: one head)."""
    script = ScriptDirectory.from_config(schema.alembic_config())
    return [r.revision for r in reversed(list(script.walk_revisions()))]


REVISION_PAIRS = list(zip(["base", *_revisions()[:-1]], _revisions()))
"""(older, newer) for every migration step; grows with the tree."""


def _tables(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return set(sa.inspect(conn).get_table_names())


def _revision(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        return schema.current_revision(conn)


def _new_campaign(led: Ledger, name: str = "demo", stages: tuple[tuple[str, str], ...] = (("smoke", "smoke"),)) -> None:
    with led.session() as s:
        c = writes.create_campaign(s, name=name, digest="ab" * 32, spec_json={"name": name}, source=f"name: {name}\n",
                                   site="local", workdir="/tmp/w")
        writes.ensure_stage_runs(s, c, stages)


def _attempt(led: Ledger, name: str = "demo", stage: str = "smoke") -> int:
    with led.session() as s:
        run = reads.get_stage_run(s, name, stage)
        assert run is not None
        return writes.create_attempt(s, run, nodes=["n0", "n1"], ranks_per_node=1, run_dir="/tmp/w/run").id


def _steps(first: int, last: int, **override: Any) -> list[dict[str, Any]]:
    rows = [{"step": i, "tokens": 1000 * i, "loss": 5.0 - 0.25 * i, "step_time_s": 0.5, "lr": 1e-3}
            for i in range(first, last + 1)]
    for row in rows:
        row.update(override.get(f"step{row['step']}", {}))
    return rows


# --- opening and creating --------------------------------------------------------------

def test_open_creates_and_migrates_a_new_database(ledger_url: str) -> None:
    led = open_ledger(ledger_url)
    try:
        assert TABLES <= _tables(led.engine)
        assert _revision(led.engine) == schema.head_revision()
        with led.session() as s:
            assert reads.list_campaigns(s) == []
    finally:
        led.close()


def test_schema_matches_the_models(ledger: Ledger) -> None:
    """The migrations build exactly what models.py declares (nothing for autogenerate to add)."""
    with ledger.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    assert diff == []


def test_sqlite_ledger_uses_wal_and_foreign_keys(tmp_path: Path) -> None:
    led = open_ledger(f"sqlite:///{tmp_path / 'deep' / 'dir' / 'ledger.db'}")
    try:
        with led.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        led.close()
    assert (tmp_path / "deep" / "dir" / "ledger.db").exists()


def _hold_write_lock(path: Path, seconds: float) -> threading.Thread:
    """Another process's write lock on a database not yet in WAL: a plain sqlite3 connection
    in rollback-journal mode inside BEGIN IMMEDIATE for `seconds` (returns once it holds it)."""
    held = threading.Event()

    def hold() -> None:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("CREATE TABLE other (a)")
        other.execute("BEGIN IMMEDIATE")
        other.execute("INSERT INTO other VALUES (1)")
        held.set()
        time.sleep(seconds)
        other.execute("COMMIT")
        other.close()

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10)
    return thread


def test_a_new_ledger_waits_for_another_connections_write_lock(tmp_path: Path) -> None:
    """Two drivers opening a new ledger together (CI, 2026-12-04): one's switch to WAL met the
    other's write lock and failed at once with 'database is locked', because SQLite does not
    call the busy handler when it raises a read lock to a write lock. It waits now."""
    path = tmp_path / "ledger.db"
    holder = _hold_write_lock(path, 0.5)
    engine = make_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("SELECT a FROM other").scalar() == 1, "the other's write was kept"
    finally:
        engine.dispose()
        holder.join()


def test_a_write_lock_held_past_the_busy_timeout_is_a_ledger_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_db, "BUSY_S", 0.2)
    path = tmp_path / "ledger.db"
    holder = _hold_write_lock(path, 1.5)
    try:
        with pytest.raises(LedgerError, match=r"cannot open the ledger at sqlite:///.*ledger\.db: database is locked"):
            open_ledger(f"sqlite:///{path}")
    finally:
        holder.join()


def test_reopen_keeps_the_data(ledger_url: str) -> None:
    led = open_ledger(ledger_url)
    _new_campaign(led)
    led.close()
    led = open_ledger(ledger_url, create=False)
    try:
        with led.session() as s:
            assert [c.name for c in reads.list_campaigns(s)] == ["demo"]
    finally:
        led.close()


def test_bad_url_is_a_ledger_error() -> None:
    with pytest.raises(LedgerError, match="not a database URL"):
        make_engine("not a url")
    with pytest.raises(LedgerError, match="unsupported database 'nonsense'"):
        make_engine("nonsense://host/db")


@pytest.mark.postgres
def test_unreachable_postgres_is_a_ledger_error() -> None:
    with pytest.raises(LedgerError, match="cannot open the ledger at postgresql"):
        open_ledger("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2")


# --- campaigns and stage runs ----------------------------------------------------------

def test_create_and_read_campaigns(ledger: Ledger) -> None:
    _new_campaign(ledger, "alpha", (("smoke", "smoke"), ("check", "loss_check")))
    _new_campaign(ledger, "beta")
    with ledger.session() as s:
        c = reads.get_campaign(s, "alpha")
        assert c is not None
        assert (c.name, c.version, c.state, c.site, c.spec_json) == ("alpha", 1, "pending", "local", {"name": "alpha"})
        assert reads.get_campaign(s, "gamma") is None
        assert sorted(x.name for x in reads.list_campaigns(s)) == ["alpha", "beta"]
        runs = reads.current_stage_runs(s, c)
        assert [(r.position, r.name, r.kind, r.state, r.attempts_count) for r in runs] == [
            (0, "smoke", "smoke", "pending", 0), (1, "check", "loss_check", "pending", 0)]
        again = writes.ensure_stage_runs(s, c, [("smoke", "smoke"), ("check", "loss_check")])
        assert [r.id for r in again] == [r.id for r in runs], "ensure_stage_runs must not duplicate"


def test_campaign_names_are_unique(ledger: Ledger) -> None:
    _new_campaign(ledger, "alpha")
    with pytest.raises(sa.exc.IntegrityError):
        _new_campaign(ledger, "alpha")
    with ledger.session() as s:
        assert len(reads.list_campaigns(s)) == 1


def test_new_version_runs_stages_afresh(ledger: Ledger) -> None:
    _new_campaign(ledger)
    with ledger.session() as s:
        c = reads.get_campaign(s, "demo")
        first = reads.current_stage_runs(s, c)[0]
        writes.set_stage_state(s, first, "passed", verdict="ok")
        writes.bump_campaign_version(s, c, digest="cd" * 32, spec_json={"v": 2}, source="v2")
        runs = writes.ensure_stage_runs(s, c, [("smoke", "smoke")])
        assert c.version == 2 and runs[0].id != first.id and runs[0].state == "pending"
        assert reads.get_stage_run(s, "demo", "smoke").id == runs[0].id


def test_summary_has_the_documented_shape(ledger: Ledger) -> None:
    _new_campaign(ledger, "demo", (("smoke", "smoke"), ("check", "loss_check")))
    attempt_id = _attempt(ledger)
    with ledger.session() as s:
        a = s.get(Attempt, attempt_id)
        writes.ingest_steps(s, a, _steps(1, 4))
        writes.set_stage_state(s, a.stage_run, "passed", verdict="every rank reported")
        writes.exclude_node(s, site="local", node="n1", reason="slow")
        writes.exclude_node(s, site="aurora", node="x1000c0s0b0n0", reason="elsewhere")
        summary = summarize_campaign(s, reads.get_campaign(s, "demo"))
    none = {"wall_s": 0.0, "productive_s": 0.0, "ettr": None, "lost": dict.fromkeys(GOODPUT_LOST, 0.0)}
    assert summary == {
        "name": "demo", "state": "pending",
        "stages": [
            {"name": "smoke", "kind": "smoke", "state": "passed", "attempts": 1, "tokens": 4000, "last_loss": 4.0,
             "verdict": "every rank reported", "goodput": none, "checkpoint_interval": None},
            {"name": "check", "kind": "loss_check", "state": "pending", "attempts": 0, "tokens": 0, "last_loss": None,
             "verdict": None, "goodput": none, "checkpoint_interval": None},
        ],
        "excluded_nodes": ["n1"], "goodput": none,
    }
    assert json.loads(json.dumps(summary)) == summary


# --- metrics ---------------------------------------------------------------------------

def test_ingestion_is_idempotent(ledger: Ledger) -> None:
    _new_campaign(ledger)
    attempt_id = _attempt(ledger)
    with ledger.session() as s:
        a = s.get(Attempt, attempt_id)
        assert writes.ingest_steps(s, a, _steps(1, 5)) == 5
    with ledger.session() as s:  # a second read of a growing metrics.jsonl overlaps the first
        a = s.get(Attempt, attempt_id)
        assert writes.ingest_steps(s, a, _steps(1, 8)) == 3
        assert writes.ingest_steps(s, a, _steps(4, 8)) == 0
        assert writes.ingest_steps(s, a, _steps(2, 3)) == 0  # an old, partial read moves nothing back
        assert writes.ingest_steps(s, a, []) == 0
    with ledger.session() as s:
        a = s.get(Attempt, attempt_id)
        steps = reads.list_steps(s, attempt_id)
        assert [m.step for m in steps] == list(range(1, 9))
        assert [m.tokens for m in steps] == [1000 * i for i in range(1, 9)]
        assert (a.first_step, a.last_step, a.tokens, a.last_loss) == (1, 8, 8000, 3.0)
        run = a.stage_run
        assert (run.steps, run.tokens, run.last_loss) == (8, 8000, 3.0)
        n = s.scalar(sa.select(sa.func.count()).select_from(StepMetric).where(StepMetric.attempt_id == attempt_id))
        assert n == 8


def test_ingestion_keeps_nonfinite_losses_and_drops_junk(ledger: Ledger) -> None:
    _new_campaign(ledger)
    attempt_id = _attempt(ledger)
    rows = _steps(1, 4, step2={"loss": float("nan")}, step3={"loss": float("inf"), "mfu": "high", "lr": True},
                  step4={"loss": float("nan")})
    rows.append({"step": 5, "loss": 1.0})  # no tokens: not a step row of the contract
    with ledger.session() as s:
        assert writes.ingest_steps(s, s.get(Attempt, attempt_id), rows) == 4
    with ledger.session() as s:
        steps = reads.list_steps(s, attempt_id)
        assert [m.step for m in steps] == [1, 2, 3, 4]
        assert steps[0].loss == 4.75
        # A non-finite loss is evidence: kept (as +inf: SQLite would turn NaN into NULL).
        assert [m.loss for m in steps[1:]] == [math.inf] * 3
        assert (steps[2].mfu, steps[2].lr) == (None, None)
        a = s.get(Attempt, attempt_id)
        assert (a.last_step, a.last_loss, a.stage_run.last_loss) == (4, math.inf, math.inf)
        summary = summarize_campaign(s, reads.get_campaign(s, "demo"))
    # `campaign status --json` must stay valid JSON (no bare NaN) for scripts.
    assert summary["stages"][0]["last_loss"] is None
    json.dumps(summary, allow_nan=False)


def test_a_float8_runs_rows_keep_both_mfu_figures(ledger: Ledger) -> None:
    """`precision: float8` rows carry `mfu_float8` (against the float8 peak) beside `mfu`; a
    bf16 row has none. Both travel into the ledger and out through `ledger export`."""
    from campaign import commands

    _new_campaign(ledger)
    attempt_id = _attempt(ledger)
    rows = _steps(1, 3, step1={"mfu": 0.4, "mfu_float8": 0.2}, step2={"mfu": 0.42, "mfu_float8": float("nan")},
                  step3={"mfu": 0.41})
    with ledger.session() as s:
        assert writes.ingest_steps(s, s.get(Attempt, attempt_id), rows) == 3
    with ledger.session() as s:
        assert [(m.mfu, m.mfu_float8) for m in reads.list_steps(s, attempt_id)] == [(0.4, 0.2), (0.42, None), (0.41, None)]
    exported = commands.export_page(ledger, "demo")["rows"]
    assert [(r["mfu"], r["mfu_float8"]) for r in exported] == [(0.4, 0.2), (0.42, None), (0.41, None)]
    assert "mfu_float8" in commands.export_columns("steps")


def test_tokens_continue_across_attempts(ledger: Ledger) -> None:
    _new_campaign(ledger)
    first = _attempt(ledger)
    with ledger.session() as s:
        writes.ingest_steps(s, s.get(Attempt, first), _steps(1, 4))
        run = reads.get_stage_run(s, "demo", "smoke")
        second = writes.create_attempt(s, run, nodes=["n0"], ranks_per_node=1, run_dir="/tmp/r2", tokens_base=4000)
        writes.ingest_steps(s, second, [{"step": 1, "tokens": 500, "loss": 2.0}])
        assert (run.tokens, run.attempts_count, second.number) == (4500, 2, 2)


def test_checkpoints_are_recorded_once_per_path(ledger: Ledger) -> None:
    _new_campaign(ledger)
    attempt_id = _attempt(ledger)
    with ledger.session() as s:
        a = s.get(Attempt, attempt_id)
        ck = writes.record_checkpoint(s, a.stage_run, a, step=10, tokens=100, path="ck/step-00000010", complete=False)
        s.flush()
        again = writes.record_checkpoint(s, a.stage_run, a, step=10, tokens=100, path="ck/step-00000010", complete=True)
        assert again.id == ck.id and again.complete


# --- nodes -----------------------------------------------------------------------------

def test_exclusions_expire_and_can_be_lifted(ledger: Ledger) -> None:
    now = utcnow()
    with ledger.session() as s:
        writes.exclude_node(s, site="local", node="n-expired", reason="old", expires=now - dt.timedelta(hours=1))
        writes.exclude_node(s, site="local", node="n-hour", reason="slow", evidence={"step_time": float("inf")},
                            expires=now + dt.timedelta(hours=1))
        writes.exclude_node(s, site="local", node="n-forever", reason="dead")
        writes.exclude_node(s, site="aurora", node="n-forever", reason="other site")
    with ledger.session() as s:
        assert [e.node for e in reads.list_exclusions(s, "local")] == ["n-forever", "n-hour"]
        later = now + dt.timedelta(hours=2)
        assert [e.node for e in reads.list_exclusions(s, "local", now=later)] == ["n-forever"]
        assert len(reads.list_exclusions(s, None)) == 3
        assert len(reads.list_exclusions(s, "local", active=False)) == 3
        hour = reads.list_exclusions(s, "local")[1]
        assert hour.evidence == {"step_time": None}  # JSON columns hold no NaN/inf (Postgres refuses them)
        assert writes.include_node(s, site="local", node="n-forever") == 1
    with ledger.session() as s:
        assert writes.include_node(s, site="local", node="n-forever") == 0
        assert [e.node for e in reads.list_exclusions(s, "local")] == ["n-hour"]
        assert [e.node for e in reads.list_exclusions(s, "aurora")] == ["n-forever"]
        lifted = [e for e in reads.list_exclusions(s, "local", active=False) if e.lifted is not None]
        assert [e.node for e in lifted] == ["n-forever"]


# --- events ----------------------------------------------------------------------------

def test_an_attempt_started_before_its_nodes_are_known_says_how_many_it_asks_for(ledger: Ledger) -> None:
    """The driver creates an attempt before the supervisor places it: its event used to read
    "stage long attempt 7 relaunch 6 on 0 node(s): " (seen in the goodput benchmark's ledgers)."""
    _new_campaign(ledger)
    with ledger.session() as s:
        run = reads.get_stage_run(s, "demo", "smoke")
        writes.create_attempt(s, run, nodes=[], ranks_per_node=1, run_dir="", label="relaunch 1", wanted=2)
        writes.create_attempt(s, run, nodes=["n0", "n1"], ranks_per_node=1, run_dir="")
    with ledger.session() as s:
        started = [e.message for e in reads.list_events(s, reads.get_campaign(s, "demo")) if e.kind == "attempt_started"]
    assert started == ["stage smoke attempt 1 relaunch 1 on 2 node(s)", "stage smoke attempt 2 on 2 node(s): n0, n1"]


def test_events_are_appended_in_order(ledger: Ledger) -> None:
    _new_campaign(ledger)
    attempt_id = _attempt(ledger)
    with ledger.session() as s:
        c = reads.get_campaign(s, "demo")
        a = s.get(Attempt, attempt_id)
        writes.set_campaign_state(s, c, "running")
        writes.set_campaign_state(s, c, "running")  # no transition, no event
        writes.set_stage_state(s, a.stage_run, "running")
        writes.finish_attempt(s, a, state="stalled", exit_code=124, suspects=[{"node": "n1"}], summary={"x": float("nan")})
        writes.add_event(s, c, "note", "by hand", data={"k": 1})
    with ledger.session() as s:
        c = reads.get_campaign(s, "demo")
        events = reads.list_events(s, c)
        kinds = [e.kind for e in events]
        assert kinds == ["campaign_created", "attempt_started", "campaign_state", "stage_state", "attempt_finished", "note"]
        assert [e.id for e in events] == sorted(e.id for e in events)
        assert events[4].data == {"state": "stalled", "exit_code": 124} and events[4].attempt_id == attempt_id
        assert [e.kind for e in reads.list_events(s, c, after_id=events[3].id)] == ["attempt_finished", "note"]
        assert s.get(Attempt, attempt_id).summary == {"x": None}


# --- the Alembic tree ------------------------------------------------------------------

def test_single_head() -> None:
    script = ScriptDirectory.from_config(schema.alembic_config())
    assert len(script.get_heads()) == 1
    assert schema.head_revision() == script.get_current_head() == _revisions()[-1]
    assert len(script.get_bases()) == 1


@pytest.mark.parametrize(("older", "newer"), REVISION_PAIRS, ids=[f"{a}-{b}" for a, b in REVISION_PAIRS])
def test_downgrade_and_upgrade_with_data(ledger_url: str, older: str, newer: str) -> None:
    """Head -> `older` -> head again, with rows in the ledger; rows survive unless `older`
    is base (then every table is gone and comes back empty)."""
    led = open_ledger(ledger_url)
    try:
        _new_campaign(led)
        attempt_id = _attempt(led)
        with led.session() as s:
            writes.ingest_steps(s, s.get(Attempt, attempt_id), _steps(1, 3))
        schema.downgrade(led.engine, older)
        assert _revision(led.engine) == (None if older == "base" else older)
        if older == "base":
            assert not _tables(led.engine) & TABLES
        schema.upgrade(led.engine, newer)
        schema.upgrade(led.engine)
        assert _revision(led.engine) == schema.head_revision()
        assert TABLES <= _tables(led.engine)
        with led.session() as s:
            names = [c.name for c in reads.list_campaigns(s)]
            steps = s.scalar(sa.select(sa.func.count()).select_from(StepMetric))
        assert (names, steps) == (([], 0) if older == "base" else (["demo"], 3))
    finally:
        led.close()


def test_goodput_after_an_upgrade_from_0002(ledger_url: str) -> None:
    """A ledger written at 0002 (before goodput) upgrades with its rows; old attempts have
    no goodput (null) until one is recorded, and status shows zeros meanwhile."""
    led = open_ledger(ledger_url)
    try:
        _new_campaign(led)
        old_id, new_id = _attempt(led), None
        schema.downgrade(led.engine, "0002")
        schema.upgrade(led.engine)
        with led.session() as s:
            assert s.get(Attempt, old_id).goodput is None
            summary = summarize_campaign(s, reads.get_campaign(s, "demo"))
            assert summary["goodput"]["wall_s"] == 0.0 and summary["stages"][0]["goodput"]["ettr"] is None
        new_id = _attempt(led)
        with led.session() as s:
            a = s.get(Attempt, new_id)
            writes.set_stage_state(s, a.stage_run, "running")
            t0 = goodput.epoch(a.started)
            rows = [{**r, "time": t0 + 2.0 + 0.5 * r["step"]} for r in _steps(1, 4)]
            writes.ingest_steps(s, a, rows)
            writes.finish_attempt(s, a, state="stalled", exit_code=124, suspects=[], summary={})
            a.finished = a.started + dt.timedelta(seconds=10.0)
            g = goodput.record_attempt(s, a, [])
        assert g["productive_s"] == pytest.approx(2.0) and g["lost"]["startup_s"] == pytest.approx(2.0)
        assert g["lost"]["detection_s"] == pytest.approx(6.0) and g["fault"] is True
        with led.session() as s:
            stage = summarize_campaign(s, reads.get_campaign(s, "demo"))["stages"][0]["goodput"]
            history = goodput.site_history(s, "local")  # the old attempt (goodput null) is not history
        assert stage["productive_s"] + sum(stage["lost"].values()) == pytest.approx(stage["wall_s"], abs=0.01)
        assert stage["productive_s"] == pytest.approx(2.0)
        assert [g["fault"] for _, g in history] == [True]
        assert goodput.job_mtbf([g for _, g in history], nodes=2) == pytest.approx(10.0)  # 10 s x 2 nodes / 1 fault / 2
    finally:
        led.close()


def test_faults_a_rescue_covered_lengthen_the_suggested_checkpoint_interval(ledger: Ledger) -> None:
    """Young/Daly trades a save against the work a fault costs; after a rescued fault that is
    none, so the interval follows the faults no rescue covers, their share estimated by
    Laplace's rule of succession ((uncovered + 1) / (faults + 2)); a launch that cannot rescue
    (one rank, FSDP, rescue off) gets no credit from the same history."""
    _new_campaign(ledger, stages=(("long", "long_run"),))

    def fault(rescue: dict[str, Any] | None) -> None:
        a_id = _attempt(ledger, stage="long")
        with ledger.session() as s:
            a = s.get(Attempt, a_id)
            writes.set_stage_state(s, a.stage_run, "running")
            t0 = goodput.epoch(a.started)
            # the checkpoint after step 2 stops training for 1 s
            writes.ingest_steps(s, a, [{**r, "time": t0 + 2.0 + 0.5 * r["step"] + (r["step"] > 2)}
                                       for r in _steps(1, 4)])
            writes.finish_attempt(s, a, state="crashed_unknown", exit_code=1, suspects=[],
                                  summary={"rescue": rescue} if rescue else {})
            a.finished = a.started + dt.timedelta(seconds=100.0)
            goodput.record_attempt(s, a, [{"event": "checkpoint_saved", "step": 2, "seconds": 1.0}])

    def suggested(rescue: bool = True) -> goodput.Suggestion:
        with ledger.session() as s:
            sug = goodput.suggest_interval(s, reads.get_campaign(s, "demo"), nodes=2, rescue=rescue, mtbf_s=400.0)
            assert sug is not None
            return sug

    fault({"saved": False, "why": "no surviving rank outside the suspect nodes"})
    plain = suggested()  # 0 of 1 rescued: 2/3 of faults uncovered
    assert plain.rescued == (0, 1) and plain.unrescued_mtbf_s == pytest.approx(600.0)
    fault({"saved": True, "step": 3, "rank": 0})
    fault({"saved": False, "covered": True, "step": 2, "why": "step 2 is already covered by a complete checkpoint"})
    sug = suggested()
    assert sug.rescued == (2, 3) and sug.unrescued_mtbf_s == pytest.approx(1000.0)  # 3 faults, 1 not rescued: 2/5
    assert sug.interval_s == pytest.approx(goodput.daly_interval(sug.save_s, 1000.0))
    assert sug.as_dict()["rescued"] == [2, 3] and sug.steps > plain.steps
    cannot = suggested(rescue=False)  # the same history, a launch that cannot rescue: every fault counts
    assert cannot.rescued == (0, 0) and cannot.unrescued_mtbf_s == 400.0 and "rescued" not in cannot.as_dict()
    assert cannot.interval_s == pytest.approx(goodput.daly_interval(cannot.save_s, 400.0)) and cannot.steps < plain.steps


# --- out-of-date schemas ---------------------------------------------------------------

def test_ledger_stamped_to_base_is_refused(ledger: Ledger, ledger_url: str) -> None:
    _new_campaign(ledger)
    command.stamp(schema.alembic_config(ledger.engine), "base")  # tables present, no revision
    for create in (True, False):
        with pytest.raises(SchemaOutOfDate) as info:
            open_ledger(ledger_url, create=create)
        assert "campaign db upgrade" in str(info.value)
        assert "revision (none)" in str(info.value) and schema.head_revision() in str(info.value)
    assert _revision(ledger.engine) is None, "a refused ledger must be left as it was"


def test_ledger_at_an_older_revision_is_refused(ledger: Ledger, ledger_url: str) -> None:
    """Every revision before head (none yet while the tree has one revision: base is
    covered above) is refused, and left as it was."""
    for older in reversed(_revisions()[:-1]):
        schema.downgrade(ledger.engine, older)
        with pytest.raises(SchemaOutOfDate, match="campaign db upgrade"):
            open_ledger(ledger_url)
        assert _revision(ledger.engine) == older


def test_ledger_from_a_newer_release_is_refused(ledger: Ledger, ledger_url: str) -> None:
    with ledger.engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'f00dcafe'"))
    with pytest.raises(SchemaOutOfDate) as info:
        open_ledger(ledger_url)
    # `campaign db upgrade` cannot help here: the advice is to upgrade campaign itself.
    assert "f00dcafe" in str(info.value) and "upgrade campaign" in str(info.value)
    assert _revision(ledger.engine) == "f00dcafe"


def test_empty_database_is_not_created_when_asked_not_to(ledger_url: str) -> None:
    if ledger_url.startswith("sqlite"):
        Path(ledger_url.removeprefix("sqlite:///")).touch()  # exists, but holds nothing
    with pytest.raises(SchemaOutOfDate, match="campaign db upgrade"):
        open_ledger(ledger_url, create=False)
    engine = make_engine(ledger_url)
    try:
        assert not _tables(engine) & TABLES
    finally:
        engine.dispose()


# --- the CLI ---------------------------------------------------------------------------

def test_status_without_a_ledger_says_so(tmp_path: Path, run_cli) -> None:
    workdir = tmp_path / "work"
    code, out, err = run_cli("status", "--workdir", workdir)
    assert (code, out) == (2, "")
    assert "no ledger at" in err and "campaign submit" in err
    assert not workdir.exists()
    missing = tmp_path / "elsewhere" / "ledger.db"
    code, out, err = run_cli("status", "demo", "--db", f"sqlite:///{missing}")
    assert code == 2 and f"no ledger at {missing}" in err
    assert not missing.exists() and not missing.parent.exists()


def test_status_reads_the_ledger(ledger: Ledger, ledger_url: str, run_cli) -> None:
    _new_campaign(ledger)
    with ledger.session() as s:
        a = writes.create_attempt(s, reads.get_stage_run(s, "demo", "smoke"), nodes=["n0"], ranks_per_node=1, run_dir="/r")
        writes.ingest_steps(s, a, _steps(1, 2) + [{"step": 3, "tokens": 3000, "loss": float("nan")}])
    code, out, err = run_cli("status", "demo", "--json", "--db", ledger_url)
    assert (code, err) == (0, "")
    summary = json.loads(out, parse_constant=lambda c: pytest.fail(f"status --json printed {c}, which is not JSON"))
    assert summary["name"] == "demo" and summary["stages"][0]["tokens"] == 3000
    code, out, err = run_cli("status", "--db", ledger_url)
    assert code == 0 and "demo" in out
    code, out, err = run_cli("status", "nope", "--db", ledger_url)
    assert code == 2 and "no campaign named 'nope'" in err and "campaigns: demo" in err


def test_db_current_and_upgrade(ledger_url: str, run_cli) -> None:
    head = schema.head_revision()
    code, out, err = run_cli("db", "current", "--db", ledger_url)
    assert (code, out) == (0, f"current: (empty)\nhead:    {head}\nneeds `campaign db upgrade`\n")
    code, out, err = run_cli("status", "--db", ledger_url)
    assert code == 2 and "campaign db upgrade" in err
    code, out, err = run_cli("db", "upgrade", "--db", ledger_url)
    assert code == 0 and out.endswith(f": at {head} (head)\n")
    code, out, err = run_cli("db", "upgrade", "--db", ledger_url)  # again: nothing to do
    assert code == 0 and out.endswith(f": at {head} (head)\n")
    code, out, err = run_cli("db", "current", "--db", ledger_url)
    assert (code, out) == (0, f"current: {head}\nhead:    {head}\nup to date\n")
    code, out, err = run_cli("status", "--json", "--db", ledger_url)
    assert (code, json.loads(out)) == (0, [])


def test_cli_refuses_an_out_of_date_ledger_until_upgraded(ledger: Ledger, ledger_url: str, run_cli) -> None:
    schema.downgrade(ledger.engine, REVISION_PAIRS[-1][0])
    code, out, err = run_cli("status", "--db", ledger_url)
    assert code == 2 and "campaign db upgrade" in err
    code, out, err = run_cli("db", "upgrade", "--db", ledger_url)
    assert code == 0
    code, out, err = run_cli("status", "--json", "--db", ledger_url)
    assert code == 0


def test_nodes_commands(tmp_path: Path, run_cli) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    code, out, err = run_cli("nodes", "exclude", "n3", "--site", "local", "--reason", "ECC errors", "--hours", "2",
                             "--db", url)
    assert (code, out) == (0, "excluded n3 on local for 2 h; lift: campaign nodes include n3 --site local\n")
    code, out, err = run_cli("nodes", "list", "--db", url)
    assert code == 0 and "n3" in out and "ECC errors" in out
    code, out, err = run_cli("nodes", "include", "n3", "--site", "local", "--db", url)
    assert (code, out) == (0, "n3 on local: 1 exclusion(s) lifted\n")
    code, out, err = run_cli("nodes", "include", "n3", "--site", "local", "--db", url)
    assert code == 2 and "n3 is not excluded on local" in err


def test_listeners_get_each_committed_event_once_and_none_of_a_rolled_back_try(ledger: Ledger) -> None:
    """The one door (`writes.add_event`) feeds the driver's observers only with what the
    ledger holds: a unit of work that rolls back tells nobody; one that commits tells each
    listener once, with the rows' ids, after the commit; a listener that raises changes nothing."""
    _new_campaign(ledger)
    attempt_id = _attempt(ledger)
    heard: list[dict[str, Any]] = []

    def broken(_: Any) -> None:
        raise RuntimeError("a sink that fails")

    ledger.listeners += [broken, heard.extend]
    with pytest.raises(ZeroDivisionError), ledger.session() as s:
        run = reads.get_stage_run(s, "demo", "smoke")
        assert run is not None
        writes.add_event(s, run.campaign, "relaunch", "never committed", stage_run=run)
        1 / 0
    assert heard == []
    with ledger.session() as s:
        a = s.get(Attempt, attempt_id)
        assert a is not None
        writes.set_stage_state(s, a.stage_run, "running")
        writes.add_event(s, a.stage_run.campaign, "relaunch", "relaunching after stalled", stage_run=a.stage_run,
                         attempt=a, data={"exit_class": "stalled", "x": math.nan})
    assert [(e["kind"], e["stage"], e["attempt"], e["campaign"], e["version"]) for e in heard] == [
        ("stage_state", "smoke", None, "demo", 1), ("relaunch", "smoke", 1, "demo", 1)]
    assert heard[1]["data"] == {"exit_class": "stalled", "x": None} and heard[1]["message"] == "relaunching after stalled"
    with ledger.session() as s:
        c = reads.get_campaign(s, "demo")
        assert c is not None
        rows = {e.id: e for e in reads.list_events(s, c)}
        assert all(rows[e["id"]].kind == e["kind"] for e in heard), "each record is its row"
        replayed = [r for r in reads.list_event_records(s, c) if r["id"] in {e["id"] for e in heard}]
    assert replayed == heard, "ledger export replays the same records the driver heard"
    assert dt.datetime.fromisoformat(heard[0]["time"]).tzinfo is not None


def test_scoped_exclusions_across_0004(ledger_url: str) -> None:
    """0004 scopes a drill's exclusion to its campaign. Upgrading keeps older exclusions
    site-wide; a scoped one binds its campaign only and goes with it; downgrading lifts the
    scoped ones (an older release would read them as the whole site's) and keeps the rest."""
    led = open_ledger(ledger_url)
    try:
        _new_campaign(led, "a")
        _new_campaign(led, "b")
        with led.session() as s:
            a, b = reads.get_campaign(s, "a"), reads.get_campaign(s, "b")
            writes.exclude_node(s, site="local", node="n-site", reason="real fault")
            writes.exclude_node(s, site="local", node="n-drill", reason="drill", campaign=a)
        with led.session() as s:
            a, b = reads.get_campaign(s, "a"), reads.get_campaign(s, "b")
            assert [e.node for e in reads.list_exclusions(s, "local", for_campaign=a.id)] == ["n-drill", "n-site"]
            assert [e.node for e in reads.list_exclusions(s, "local", for_campaign=b.id)] == ["n-site"]
            assert summarize_campaign(s, b)["excluded_nodes"] == ["n-site"]
        schema.downgrade(led.engine, "0003")
        with led.engine.connect() as conn:
            rows = dict(conn.execute(sa.text("SELECT node, lifted IS NOT NULL FROM exclusion")).all())
        assert rows == {"n-site": False, "n-drill": True}
        schema.upgrade(led.engine)
        with led.session() as s:
            assert [e.node for e in reads.list_exclusions(s, "local")] == ["n-site"]
            assert all(e.campaign_id is None for e in reads.list_exclusions(s, "local", active=False))
            writes.exclude_node(s, site="local", node="n-drill2", reason="drill", campaign=reads.get_campaign(s, "a"))
        with led.session() as s:
            writes.delete_campaign(s, reads.get_campaign(s, "a"))
        with led.session() as s:
            assert [e.node for e in reads.list_exclusions(s, "local", active=False)] == ["n-drill", "n-site"]
    finally:
        led.close()


def test_mfu_float8_across_0005(ledger_url: str) -> None:
    """0005 adds `step_metric.mfu_float8`. Downgrading drops it and keeps the rows and their
    `mfu`; upgrading again leaves the older rows without one and records it for new rows."""
    led = open_ledger(ledger_url)
    try:
        _new_campaign(led)
        attempt_id = _attempt(led)
        with led.session() as s:
            writes.ingest_steps(s, s.get(Attempt, attempt_id), _steps(1, 2, step1={"mfu": 0.4, "mfu_float8": 0.2}))
        schema.downgrade(led.engine, "0004")
        with led.engine.connect() as conn:
            assert "mfu_float8" not in {c["name"] for c in sa.inspect(conn).get_columns("step_metric")}
            assert conn.execute(sa.text("SELECT step, mfu FROM step_metric ORDER BY step")).all() == [(1, 0.4), (2, None)]
        schema.upgrade(led.engine)
        with led.session() as s:
            writes.ingest_steps(s, s.get(Attempt, attempt_id), _steps(3, 3, step3={"mfu": 0.5, "mfu_float8": 0.25}))
        with led.session() as s:
            assert [m.mfu_float8 for m in reads.list_steps(s, attempt_id)] == [None, None, 0.25]
    finally:
        led.close()
