"""Every ledger query, as `verb_noun(session, ...)`. None of them commits: the caller's
`Ledger.session()` does, so one unit of work is one transaction.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from campaign.ledger.models import Attempt, Campaign, Checkpoint, Event, Exclusion, StageRun, StepMetric, utcnow

METRIC_FIELDS = ("loss", "step_time_s", "tokens_per_s", "mfu", "comm_time_s", "mem_peak_gib", "lr", "grad_norm", "time")


# --- campaigns -------------------------------------------------------------------------

def get_campaign(s: Session, name: str) -> Campaign | None:
    return s.scalar(sa.select(Campaign).where(Campaign.name == name))


def list_campaigns(s: Session) -> Sequence[Campaign]:
    return s.scalars(sa.select(Campaign).order_by(Campaign.updated.desc())).all()


def create_campaign(s: Session, *, name: str, digest: str, spec_json: dict[str, Any], source: str,
                    site: str, workdir: str) -> Campaign:
    c = Campaign(name=name, spec_digest=digest, spec_json=spec_json, spec_source=source, site=site, workdir=workdir)
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


def set_campaign_state(s: Session, c: Campaign, state: str, message: str = "") -> None:
    if c.state != state:
        add_event(s, c, "campaign_state", message or f"campaign {c.state} -> {state}", data={"from": c.state, "to": state})
        c.state = state


# --- stage runs ------------------------------------------------------------------------

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


def current_stage_runs(s: Session, c: Campaign) -> Sequence[StageRun]:
    q = sa.select(StageRun).where(StageRun.campaign_id == c.id, StageRun.version == c.version)
    return s.scalars(q.order_by(StageRun.position)).all()


def get_stage_run(s: Session, campaign: str, stage: str) -> StageRun | None:
    """The newest stage run named `stage` of campaign `campaign` (any version)."""
    q = (sa.select(StageRun).join(Campaign).where(Campaign.name == campaign, StageRun.name == stage)
         .order_by(StageRun.version.desc()).limit(1))
    return s.scalar(q)


def set_stage_state(s: Session, run: StageRun, state: str, *, verdict: str | None = None,
                    numbers: dict[str, Any] | None = None) -> None:
    now = utcnow()
    if state == "running" and run.started is None:
        run.started = now
    if state in ("passed", "failed", "skipped"):
        run.finished = now
    if verdict is not None:
        run.verdict = verdict
    if numbers is not None:
        run.numbers = _jsonable(numbers)
    add_event(s, run.campaign, "stage_state", f"stage {run.name}: {run.state} -> {state}" + (f": {verdict}" if verdict else ""),
              stage_run=run, data={"from": run.state, "to": state})
    run.state = state


# --- attempts --------------------------------------------------------------------------

def create_attempt(s: Session, run: StageRun, *, nodes: list[str], ranks_per_node: int, run_dir: str,
                   label: str = "", tokens_base: int = 0) -> Attempt:
    run.attempts_count += 1
    a = Attempt(stage_run_id=run.id, number=run.attempts_count, nodes=nodes, ranks_per_node=ranks_per_node,
                run_dir=run_dir, label=label, tokens_base=tokens_base)
    s.add(a)
    s.flush()
    add_event(s, run.campaign, "attempt_started", f"stage {run.name} attempt {a.number}{' ' + label if label else ''} "
              f"on {len(nodes)} node(s): {', '.join(nodes[:8])}{' ...' if len(nodes) > 8 else ''}", stage_run=run, attempt=a)
    return a


def finish_attempt(s: Session, a: Attempt, *, state: str, exit_code: int | None, suspects: list[dict[str, Any]],
                   summary: dict[str, Any]) -> None:
    a.state, a.exit_code, a.finished = state, exit_code, utcnow()
    a.suspects, a.summary = _jsonable(suspects), _jsonable(summary)
    run = a.stage_run
    add_event(s, run.campaign, "attempt_finished", f"stage {run.name} attempt {a.number}: {state} (exit {exit_code}) "
              f"at step {a.last_step}", stage_run=run, attempt=a, data={"state": state, "exit_code": exit_code})


def ingest_steps(s: Session, a: Attempt, rows: Sequence[dict[str, Any]]) -> int:
    """Insert the trainer's step rows for attempt `a`; rows already there are ignored, so
    ingesting the same metrics.jsonl twice is harmless. Updates the counters status reads."""
    if not rows:
        return 0
    values = [_step_values(a.id, r) for r in rows if "step" in r and "tokens" in r]
    if not values:
        return 0
    # RETURNING counts the rows really inserted; rowcount is -1 for an executemany on psycopg.
    inserted = len(s.execute(_insert_ignore(s).returning(StepMetric.__table__.c.id), values).all())
    last = max(values, key=lambda v: v["step"])
    if a.last_step is None or last["step"] >= a.last_step:
        a.last_step, a.tokens, a.last_loss = last["step"], last["tokens"], last["loss"]
    first = min(v["step"] for v in values)
    a.first_step = first if a.first_step is None else min(a.first_step, first)
    run = a.stage_run
    run.tokens = max(run.tokens, a.tokens_base + a.tokens)
    run.steps = max(run.steps, a.last_step or 0)
    run.last_loss = a.last_loss
    return inserted


def _insert_ignore(s: Session) -> Any:
    table = StepMetric.__table__
    if s.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing(index_elements=["attempt_id", "step"])
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table).on_conflict_do_nothing(index_elements=["attempt_id", "step"])


def _step_values(attempt_id: int, r: dict[str, Any]) -> dict[str, Any]:
    out = {"attempt_id": attempt_id, "step": int(r["step"]), "tokens": int(r["tokens"])}
    for k in METRIC_FIELDS:
        v = r.get(k)
        out[k] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None
    if out["loss"] is None and isinstance(r.get("loss"), float):
        # A non-finite loss is evidence: keep it, as +inf, since SQLite stores NaN as NULL.
        out["loss"] = math.inf
    return out


def list_steps(s: Session, attempt_id: int) -> Sequence[StepMetric]:
    q = sa.select(StepMetric).where(StepMetric.attempt_id == attempt_id).order_by(StepMetric.step)
    return s.scalars(q).all()


def record_checkpoint(s: Session, run: StageRun, a: Attempt | None, *, step: int, tokens: int, path: str,
                      complete: bool) -> Checkpoint:
    ck = s.scalar(sa.select(Checkpoint).where(Checkpoint.stage_run_id == run.id, Checkpoint.path == path))
    if ck is None:
        ck = Checkpoint(stage_run_id=run.id, attempt_id=a.id if a else None, step=step, tokens=tokens, path=path)
        s.add(ck)
    ck.complete = complete
    return ck


# --- nodes -----------------------------------------------------------------------------

def list_exclusions(s: Session, site: str | None = None, *, active: bool = True,
                    now: dt.datetime | None = None) -> Sequence[Exclusion]:
    q = sa.select(Exclusion)
    if site is not None:
        q = q.where(Exclusion.site == site)
    if active:
        now = now or utcnow()
        q = q.where(Exclusion.lifted.is_(None), sa.or_(Exclusion.expires.is_(None), Exclusion.expires > now))
    return s.scalars(q.order_by(Exclusion.node)).all()


def exclude_node(s: Session, *, site: str, node: str, reason: str, evidence: dict[str, Any] | None = None,
                 attempt: Attempt | None = None, expires: dt.datetime | None = None) -> Exclusion:
    ex = Exclusion(site=site, node=node, reason=reason, evidence=_jsonable(evidence or {}),
                   attempt_id=attempt.id if attempt else None, expires=expires)
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


# --- events and views ------------------------------------------------------------------

def add_event(s: Session, c: Campaign, kind: str, message: str, *, stage_run: StageRun | None = None,
              attempt: Attempt | None = None, data: dict[str, Any] | None = None) -> Event:
    ev = Event(campaign_id=c.id, stage_run_id=stage_run.id if stage_run else None,
               attempt_id=attempt.id if attempt else None, kind=kind, message=message, data=_jsonable(data or {}))
    s.add(ev)
    return ev


def list_events(s: Session, c: Campaign, *, after_id: int = 0, limit: int = 1000) -> Sequence[Event]:
    q = sa.select(Event).where(Event.campaign_id == c.id, Event.id > after_id).order_by(Event.id).limit(limit)
    return s.scalars(q).all()


def summarize_campaign(s: Session, c: Campaign) -> dict[str, Any]:
    """The shape `campaign status NAME --json` prints (scripts rely on it: add keys, never change them)."""
    stages = [
        {"name": r.name, "kind": r.kind, "state": r.state, "attempts": r.attempts_count, "tokens": int(r.tokens),
         "last_loss": _jsonable(r.last_loss), "verdict": r.verdict}
        for r in current_stage_runs(s, c)
    ]
    excluded = sorted({e.node for e in list_exclusions(s, c.site)})
    return {"name": c.name, "state": c.state, "stages": stages, "excluded_nodes": excluded}


def _jsonable(value: Any) -> Any:
    """JSON columns reject NaN on Postgres; store non-finite floats as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
