"""The ledger's writes: every unit of work that changes it, as `verb_noun(session, ...)`.

None of them commits: the caller's `Ledger.session()` (or `Ledger.retrying`) does, so one
unit of work is one transaction. Only the driver (and the CLI's `nodes`/`import-reference`
commands) call these. Queries that only read are in `campaign.ledger.reads`.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from campaign.exits import ExitClass
from campaign.fields import LOSS, METRIC_FIELDS, STEP, TOKENS
from campaign.ledger.models import Attempt, Campaign, Checkpoint, Event, Exclusion, Lease, StageRun, db_utcnow, utcnow
from campaign.ledger.db import COMMITTED_EVENTS
from campaign.ledger.reads import current_stage_runs, event_record, get_lease, jsonable, list_exclusions, stage_mfu


def create_campaign(s: Session, *, name: str, digest: str, spec_json: dict[str, Any], source: str,
                    site: str, workdir: str, spec_dir: str = "") -> Campaign:
    c = Campaign(name=name, spec_digest=digest, spec_json=spec_json, spec_source=source, site=site, workdir=workdir,
                 spec_dir=spec_dir)
    s.add(c)
    s.flush()
    add_event(s, c, "campaign_created", f"campaign {name} created (spec {digest[:12]})")
    return c


def bump_campaign_version(s: Session, c: Campaign, *, digest: str, spec_json: dict[str, Any], source: str) -> None:
    """A new version of the spec: earlier stage runs stay in history; stages run afresh."""
    old = c.spec_digest
    c.version += 1
    c.spec_digest, c.spec_json, c.spec_source, c.state = digest, spec_json, source, "pending"
    add_event(s, c, "campaign_new_version", f"spec changed ({old[:12]} -> {digest[:12]}): version {c.version}")


def refresh_campaign_digest(s: Session, c: Campaign, *, digest: str, spec_json: dict[str, Any]) -> None:
    """The stored file unchanged, read by a newer release (new fields at their defaults):
    same campaign and version, this release's digest and resolved spec."""
    old = c.spec_digest
    c.spec_digest, c.spec_json = digest, spec_json
    add_event(s, c, "campaign_spec_refreshed", f"same file, digest of this release ({old[:12]} -> {digest[:12]})")


def set_campaign_state(s: Session, c: Campaign, state: str, message: str = "") -> None:
    if c.state != state:
        add_event(s, c, "campaign_state", message or f"campaign {c.state} -> {state}", data={"from": c.state, "to": state})
        c.state = state


def ensure_stage_runs(s: Session, c: Campaign, stages: Iterable[tuple[str, str]]) -> list[StageRun]:
    """The stage runs of the campaign's current version, created pending where missing."""
    existing = {r.name: r for r in current_stage_runs(s, c)}
    out = []
    for position, (name, kind) in enumerate(stages):
        run = existing.get(name)
        if run is None:
            run = StageRun(campaign_id=c.id, version=c.version, position=position, name=name, kind=kind)
            s.add(run)
        out.append(run)
    s.flush()
    return out


def set_stage_state(s: Session, run: StageRun, state: str, *, verdict: str | None = None,
                    numbers: dict[str, Any] | None = None) -> None:
    now = utcnow()
    if state == "running" and run.started is None:
        run.started = now
    if state in ("passed", "failed", "skipped"):
        run.finished = now
    if verdict is not None:
        run.verdict = verdict
    elif state == "running":
        run.verdict = None  # an earlier run's verdict (a cancel's, say) is no longer what the stage says
    mfu = stage_mfu(s, run.id) if state in ("passed", "failed") else {}  # a device with a known peak
    if mfu:
        numbers = {**(numbers if numbers is not None else run.numbers or {}), **{k: round(v, 4) for k, v in mfu.items()}}
    if numbers is not None:
        run.numbers = jsonable(numbers)
    add_event(s, run.campaign, "stage_state", f"stage {run.name}: {run.state} -> {state}" + (f": {verdict}" if verdict else ""),
              stage_run=run, data={"from": run.state, "to": state})
    run.state = state


def create_attempt(s: Session, run: StageRun, *, nodes: list[str], ranks_per_node: int, run_dir: str,
                   label: str = "", tokens_base: int = 0, target_steps: int | None = None,
                   wanted: int | None = None) -> Attempt:
    """`nodes`: where it runs if known now; else `wanted` says how many it asks for (the
    supervisor records the nodes it got)."""
    run.attempts_count += 1
    a = Attempt(stage_run_id=run.id, number=run.attempts_count, nodes=nodes, ranks_per_node=ranks_per_node,
                run_dir=run_dir, label=label, tokens_base=tokens_base, target_steps=target_steps)
    s.add(a)
    s.flush()
    where = (f"on {len(nodes)} node(s): {', '.join(nodes[:8])}{' ...' if len(nodes) > 8 else ''}" if nodes else
             f"on {wanted} node(s)" if wanted else "")
    add_event(s, run.campaign, "attempt_started", f"stage {run.name} attempt {a.number}{' ' + label if label else ''}"
              + (f" {where}" if where else ""), stage_run=run, attempt=a)
    return a


def finish_attempt(s: Session, a: Attempt, *, state: str, exit_code: int | None, suspects: list[dict[str, Any]],
                   summary: dict[str, Any]) -> None:
    a.state, a.exit_code, a.finished = state, exit_code, utcnow()
    a.suspects, a.summary = jsonable(suspects), jsonable(summary)
    run = a.stage_run
    add_event(s, run.campaign, "attempt_finished", f"stage {run.name} attempt {a.number}: {state} (exit {exit_code}) "
              f"at step {a.last_step}", stage_run=run, attempt=a, data={"state": state, "exit_code": exit_code})


def record_bad_event_rows(s: Session, a: Attempt, bad: dict[str, Any]) -> None:
    """Keep in the attempt's summary the lines of its events.jsonl that were skipped
    ({"count", "examples", "file"}), with an event that says so."""
    a.summary = {**(a.summary or {}), "bad_event_rows": jsonable(bad)}
    run = a.stage_run
    add_event(s, run.campaign, "bad_event_rows", f"stage {run.name} attempt {a.number}: events skipped "
              f"in {bad.get('file')}: {(bad.get('examples') or ['?'])[0]}", stage_run=run, attempt=a,
              data={"count": bad.get("count")})


def record_bad_metric_rows(s: Session, a: Attempt, bad: dict[str, Any], *, first: bool = False) -> None:
    """Keep in the attempt's summary the rows of its metrics.jsonl that ingestion skipped
    ({"count", "examples", "file"}); the first time, an event says so."""
    a.summary = {**(a.summary or {}), "bad_metric_rows": jsonable(bad)}
    if first:
        run = a.stage_run
        add_event(s, run.campaign, "bad_metric_rows", f"stage {run.name} attempt {a.number}: metrics rows skipped "
                  f"in {bad.get('file')}: {(bad.get('examples') or ['?'])[0]}", stage_run=run, attempt=a,
                  data={"count": bad.get("count")})


def ingest_steps(s: Session, a: Attempt, rows: Sequence[dict[str, Any]]) -> int:
    """Insert the trainer's step rows for attempt `a`; rows already there are ignored, so
    ingesting the same metrics.jsonl twice is harmless. Updates the counters status reads."""
    if not rows:
        return 0
    attempt_id = a.id  # read once: an ORM attribute costs more than the row itself
    values = [_step_values(attempt_id, r) for r in rows if STEP in r and TOKENS in r]
    if not values:
        return 0
    # At the driver, in the session's own transaction: SQLite gets one executemany (sqlite3
    # sums rowcount over it), Postgres one INSERT ... SELECT FROM unnest(column arrays).
    # ON CONFLICT DO NOTHING leaves ignored rows out of the count. Several times faster than
    # compiled inserts with RETURNING, which matters at millions of steps.
    cursor = s.connection().connection.cursor()
    try:
        if s.get_bind().dialect.name == "postgresql":
            cursor.execute(_PG_INSERT_IGNORE, [list(col) for col in zip(*values)])
        else:
            cursor.executemany(_insert_ignore_sql(s), values)
        inserted = cursor.rowcount
    finally:
        cursor.close()
    last = max(values, key=lambda v: v[1])
    if a.last_step is None or last[1] >= a.last_step:
        a.last_step, a.tokens, a.last_loss = last[1], last[2], last[3]
    first = min(v[1] for v in values)
    a.first_step = first if a.first_step is None else min(a.first_step, first)
    run = a.stage_run
    run.tokens = max(run.tokens, a.tokens_base + a.tokens)
    run.steps = max(run.steps, a.last_step or 0)
    run.last_loss = a.last_loss
    return max(int(inserted), 0)


_STEP_COLUMNS = ("attempt_id", "step", "tokens", *METRIC_FIELDS)
"""Column order of the tuples `_step_values` builds (loss is the fourth)."""


_PG_INSERT_IGNORE = (
    f"INSERT INTO step_metric ({', '.join(_STEP_COLUMNS)}) SELECT * FROM unnest(%s::integer[], %s::integer[], "
    f"%s::bigint[], {', '.join(['%s::double precision[]'] * len(METRIC_FIELDS))}) ON CONFLICT (attempt_id, step) DO NOTHING"
)


def _insert_ignore_sql(s: Session) -> str:
    mark = "?" if s.get_bind().dialect.paramstyle == "qmark" else "%s"
    return (f"INSERT INTO step_metric ({', '.join(_STEP_COLUMNS)}) VALUES ({', '.join([mark] * len(_STEP_COLUMNS))}) "
            "ON CONFLICT (attempt_id, step) DO NOTHING")


def _step_values(attempt_id: int, r: dict[str, Any]) -> tuple[Any, ...]:
    get = r.get
    out: list[Any] = [attempt_id, int(r[STEP]), int(r[TOKENS])]
    for k in METRIC_FIELDS:
        v = get(k)
        if v is not None and type(v) is not float:  # floats (the common case) take one test
            v = float(v) if isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**1023 else None
        out.append(v if v is None or v - v == 0.0 else None)  # v - v is NaN for NaN and +-inf
    if out[3] is None and isinstance(get(LOSS), float):
        # A non-finite loss is evidence: keep it, as +inf, since SQLite stores NaN as NULL.
        out[3] = math.inf
    return tuple(out)


def record_checkpoint(s: Session, run: StageRun, a: Attempt | None, *, step: int, tokens: int, path: str,
                      complete: bool) -> Checkpoint:
    ck = s.scalar(sa.select(Checkpoint).where(Checkpoint.stage_run_id == run.id, Checkpoint.path == path))
    if ck is None:
        ck = Checkpoint(stage_run_id=run.id, attempt_id=a.id if a else None, step=step, tokens=tokens, path=path)
        s.add(ck)
    ck.complete = complete
    return ck


def exclude_node(s: Session, *, site: str, node: str, reason: str, evidence: dict[str, Any] | None = None,
                 attempt: Attempt | None = None, expires: dt.datetime | None = None,
                 campaign: Campaign | None = None) -> Exclusion:
    """Exclude `node` on `site`: from every campaign there, or only from `campaign` (a
    drill's exclusion: deleted with the campaign)."""
    ex = Exclusion(site=site, node=node, reason=reason, evidence=jsonable(evidence or {}),
                   attempt_id=attempt.id if attempt else None, expires=expires,
                   campaign_id=campaign.id if campaign else None)
    s.add(ex)
    return ex


def include_node(s: Session, *, site: str, node: str) -> int:
    """Lift every active exclusion of `node` on `site`; returns how many were lifted."""
    lifted = 0
    for ex in list_exclusions(s, site):
        if ex.node == node:
            ex.lifted = utcnow()
            lifted += 1
    return lifted


def first_lease(s: Session, c: Campaign, *, host: str, pid: int, token: str, ttl_s: float) -> Lease:
    """Insert the campaign's first lease row, and only insert: if another driver's row is
    there by now (it inserted after our look found none), the flush raises IntegrityError
    on the unique campaign_id and that driver keeps its lease."""
    lease = Lease(campaign_id=c.id, host=host, pid=pid, token=token, ttl_s=ttl_s, renewed=db_utcnow(s))
    s.add(lease)
    s.flush()
    return lease


def take_lease(s: Session, c: Campaign, *, host: str, pid: int, token: str, ttl_s: float) -> Lease:
    """Make (host, pid, token) the campaign's driver, replacing any earlier lease row
    unconditionally (fixtures and repairs; a driver takes its lease with `first_lease` or a
    compare-and-swap on the holder's token, never this)."""
    lease = get_lease(s, c)
    if lease is None:
        lease = Lease(campaign_id=c.id, host=host, pid=pid, token=token, ttl_s=ttl_s)
        s.add(lease)
    else:
        lease.host, lease.pid, lease.token, lease.ttl_s = host, pid, token, ttl_s
    lease.renewed = db_utcnow(s)  # the ledger's clock: hosts' clocks may disagree
    s.flush()
    return lease


def drop_lease(s: Session, c: Campaign, token: str) -> None:
    lease = get_lease(s, c)
    if lease is not None and lease.token == token:
        s.delete(lease)


def add_event(s: Session, c: Campaign, kind: str, message: str, *, stage_run: StageRun | None = None,
              attempt: Attempt | None = None, data: dict[str, Any] | None = None) -> Event:
    """The one door of every transition: the event row, and its record (`reads.event_record`)
    for the ledger's listeners (`Ledger.listeners`: the driver's observers), who get it once
    the unit of work has committed, never for a try that rolled back."""
    ev = Event(campaign_id=c.id, stage_run_id=stage_run.id if stage_run else None,
               attempt_id=attempt.id if attempt else None, kind=kind, message=message, data=jsonable(data or {}),
               created=utcnow())
    s.add(ev)
    campaign, version = c.name, stage_run.version if stage_run else c.version
    stage, number = stage_run.name if stage_run else None, attempt.number if attempt else None
    # Made after the commit, when the row has its id (the order of every event of the ledger).
    s.info.setdefault(COMMITTED_EVENTS, []).append(
        lambda: event_record(ev, campaign=campaign, version=version, stage=stage, attempt=number))
    return ev


def delete_campaign(s: Session, c: Campaign) -> None:
    """Delete a campaign and all it holds (the database cascades to every child row)."""
    s.execute(sa.delete(Campaign).where(Campaign.id == c.id))
    s.expunge_all()


def import_reference(s: Session, name: str, runs: Sequence[dict[str, Any]], *, source: str) -> Campaign:
    """Store reference curves as a campaign of site "imported": one stage run per stage,
    one attempt per (stage, attempt), its points as step rows. Each run is
    {"stage", "attempt", "node_count", "rows": [{"step", "tokens", "loss"}]}."""
    stages = list(dict.fromkeys(r["stage"] for r in runs))
    c = create_campaign(s, name=name, digest="0" * 64, spec_json={"name": name, "imported_from": source},
                        source="", site="imported", workdir="")
    by_name = {run.name: run for run in ensure_stage_runs(s, c, [(st, "imported") for st in stages])}
    for r in runs:
        run = by_name[r["stage"]]
        a = create_attempt(s, run, nodes=[], ranks_per_node=1, run_dir="", label=r.get("label", ""))
        a.summary = {"node_count": r.get("node_count"), "source": source}
        ingest_steps(s, a, r["rows"])
        a.state, a.exit_code, a.finished = ExitClass.SUCCEEDED, 0, a.started
    for run in by_name.values():
        set_stage_state(s, run, "passed", verdict=f"imported from {source}")
    set_campaign_state(s, c, "succeeded", f"imported from {source}")
    return c
