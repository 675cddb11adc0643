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

from campaign.errors import CampaignError
from campaign.ledger.models import Attempt, Campaign, Checkpoint, Event, Exclusion, Lease, StageRun, StepMetric, utcnow

METRIC_FIELDS = ("loss", "step_time_s", "tokens_per_s", "mfu", "comm_time_s", "mem_peak_gib", "lr", "grad_norm", "time")


# --- campaigns -------------------------------------------------------------------------

def get_campaign(s: Session, name: str) -> Campaign | None:
    return s.scalar(sa.select(Campaign).where(Campaign.name == name))


def list_campaigns(s: Session) -> Sequence[Campaign]:
    return s.scalars(sa.select(Campaign).order_by(Campaign.updated.desc())).all()


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
    attempt_id = a.id  # read once: an ORM attribute costs more than the row itself
    values = [_step_values(attempt_id, r) for r in rows if "step" in r and "tokens" in r]
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
    out: list[Any] = [attempt_id, int(r["step"]), int(r["tokens"])]
    for k in METRIC_FIELDS:
        v = get(k)
        if v is not None and type(v) is not float:  # floats (the common case) take one test
            v = float(v) if isinstance(v, int) and not isinstance(v, bool) else None
        out.append(v if v is None or v - v == 0.0 else None)  # v - v is NaN for NaN and +-inf
    if out[3] is None and isinstance(get("loss"), float):
        # A non-finite loss is evidence: keep it, as +inf, since SQLite stores NaN as NULL.
        out[3] = math.inf
    return tuple(out)


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


# --- leases and open attempts -----------------------------------------------------------

def get_lease(s: Session, c: Campaign) -> Lease | None:
    return s.scalar(sa.select(Lease).where(Lease.campaign_id == c.id))


def take_lease(s: Session, c: Campaign, *, host: str, pid: int, token: str, ttl_s: float) -> Lease:
    """Make (host, pid, token) the campaign's driver, replacing any earlier lease row."""
    lease = get_lease(s, c)
    if lease is None:
        lease = Lease(campaign_id=c.id, host=host, pid=pid, token=token, ttl_s=ttl_s)
        s.add(lease)
    else:
        lease.host, lease.pid, lease.token, lease.ttl_s = host, pid, token, ttl_s
    lease.renewed = utcnow()
    s.flush()
    return lease


def drop_lease(s: Session, c: Campaign, token: str) -> None:
    lease = get_lease(s, c)
    if lease is not None and lease.token == token:
        s.delete(lease)


def list_open_attempts(s: Session, c: Campaign) -> Sequence[Attempt]:
    """Attempts still marked running: after a driver crash these are orphans."""
    q = (sa.select(Attempt).join(StageRun).where(StageRun.campaign_id == c.id, Attempt.state == "running")
         .order_by(Attempt.id))
    return s.scalars(q).all()


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


# --- seeing the campaign: status detail, plots, export, imported references ------------
# Status reads only campaign / stage_run / attempt / exclusion / event rows (their counters),
# never step_metric. Plot queries downsample in SQL on the (attempt_id, step) unique index,
# so a 1,000,000-step campaign costs a few thousand rows, not a million.

ROUTINE_EVENTS = frozenset({"campaign_created", "campaign_state", "stage_state", "attempt_started", "attempt_finished"})
"""Event kinds every campaign has; the others (watchdog actions, exclusions, relaunches) are news."""


def list_attempts(s: Session, c: Campaign) -> Sequence[tuple[StageRun, Attempt]]:
    """(stage run, attempt) of the campaign's current version, in stage and attempt order."""
    q = (sa.select(StageRun, Attempt).join(Attempt, Attempt.stage_run_id == StageRun.id)
         .where(StageRun.campaign_id == c.id, StageRun.version == c.version)
         .order_by(StageRun.position, Attempt.number))
    return [(r, a) for r, a in s.execute(q).all()]


def attempt_node_count(a: Attempt) -> int:
    """Nodes of an attempt: its node list, or the count an imported run declared."""
    return int((a.summary or {}).get("node_count") or len(a.nodes or []))


def describe_attempt(run: StageRun, a: Attempt) -> dict[str, Any]:
    """One attempt as `status --json` shows it under "attempts_detail" (JSON-ready)."""
    duration = (a.finished - a.started).total_seconds() if a.finished and a.started else None
    return {"stage": run.name, "number": a.number, "label": a.label, "state": a.state, "exit_code": a.exit_code,
            "nodes": list(a.nodes or []), "node_count": attempt_node_count(a), "first_step": a.first_step,
            "last_step": a.last_step, "tokens": int(a.tokens_base + a.tokens) if a.last_step is not None else None,
            "last_loss": _jsonable(a.last_loss), "started": _iso(a.started), "finished": _iso(a.finished),
            "duration_s": duration, "suspects": [x.get("node") for x in (a.suspects or []) if isinstance(x, dict)]}


def describe_campaign(s: Session, c: Campaign, *, events: int = 10) -> dict[str, Any]:
    """`summarize_campaign` plus the detail `campaign status NAME` shows, in NEW keys only:
    site, version, updated, attempts_detail, stage_numbers, exclusions, scaling, events."""
    out = summarize_campaign(s, c)
    runs = current_stage_runs(s, c)
    out["site"], out["version"], out["updated"] = c.site, c.version, _iso(c.updated)
    out["attempts_detail"] = [describe_attempt(r, a) for r, a in list_attempts(s, c)]
    out["stage_numbers"] = {r.name: _jsonable(r.numbers or {}) for r in runs}
    out["exclusions"] = [
        {"node": e.node, "reason": e.reason, "since": _iso(e.created), "expires": _iso(e.expires),
         "attempt_id": e.attempt_id}
        for e in list_exclusions(s, c.site)
    ]
    out["scaling"] = [{"stage": r.name, "rows": _jsonable(r.numbers["table"])}
                      for r in runs if r.kind == "scaling" and isinstance((r.numbers or {}).get("table"), list)]
    q = (sa.select(Event).where(Event.campaign_id == c.id, Event.kind.not_in(ROUTINE_EVENTS))
         .order_by(Event.id.desc()).limit(events))
    out["events"] = [{"time": _iso(e.created), "kind": e.kind, "message": e.message} for e in reversed(s.scalars(q).all())]
    return out


def sample_steps(s: Session, attempts: Sequence[Attempt], *, max_points: int = 4000,
                 columns: Sequence[str] = ("loss",)) -> dict[int, list[tuple[Any, ...]]]:
    """(step, tokens, *columns) rows per attempt id, at most about `max_points` in all.

    The budget is shared by the attempts' step spans; an attempt with more steps than its
    share keeps every k-th step (counted from its first) and its last one, chosen in SQL
    through the (attempt_id, step) unique index, so a million steps are never loaded."""
    spans = {a.id: (a.first_step, a.last_step) for a in attempts if a.first_step is not None and a.last_step is not None}
    total = sum(last - first + 1 for first, last in spans.values()) or 1
    cols = [StepMetric.step, StepMetric.tokens, *(getattr(StepMetric, c) for c in columns)]
    out: dict[int, list[tuple[Any, ...]]] = {}
    for attempt_id, (first, last) in spans.items():
        span = last - first + 1
        share = max(2, max_points * span // total)
        k = -(-span // share)
        q = sa.select(*cols).where(StepMetric.attempt_id == attempt_id).order_by(StepMetric.step)
        if k == 1:
            out[attempt_id] = [tuple(row) for row in s.execute(q).all()]
            continue
        # Dense steps (the usual case): one index seek per wanted step. If the trainer logged
        # sparsely and most wanted steps are missing, take every k-th logged step instead
        # (a scan of this attempt's index range, still done in SQL).
        wanted = [*range(first, last, k), last]
        rows = s.execute(q.where(StepMetric.step.in_(wanted))).all()
        if len(rows) < len(wanted) // 2:
            rows = s.execute(q.where(sa.or_((StepMetric.step - first) % k == 0, StepMetric.step == last))).all()
        out[attempt_id] = [tuple(row) for row in rows]
    return out


def sample_campaign_steps(s: Session, c: Campaign, *, stage: str | None = None, max_points: int = 4000,
                          columns: Sequence[str] = ("loss",)) -> list[dict[str, Any]]:
    """One series per attempt of the campaign (or of one stage), downsampled in SQL: the
    attempt's description plus `steps`, `tokens` (stage-cumulative: tokens_base added) and
    one list per column."""
    pairs = [(r, a) for r, a in list_attempts(s, c) if stage is None or r.name == stage]
    samples = sample_steps(s, [a for _, a in pairs], max_points=max_points, columns=columns)
    series = []
    for run, a in pairs:
        rows = samples.get(a.id, [])
        item = {"campaign": c.name, "site": c.site, "stage": run.name, "kind": run.kind, **describe_attempt(run, a),
                "steps": [r[0] for r in rows], "tokens": [a.tokens_base + r[1] for r in rows]}
        item["attempt_tokens"] = [r[1] for r in rows]
        for i, col in enumerate(columns):
            item[col] = [r[2 + i] for r in rows]
        series.append(item)
    return series


EXPORT_STEP_COLUMNS = ("stage", "attempt", "label", "nodes", "step", "tokens", "attempt_tokens", *METRIC_FIELDS)
"""Columns of `ledger export --what steps`: `tokens` is stage-cumulative, `attempt_tokens` as the trainer reported."""


def iter_campaign_steps(s: Session, c: Campaign, *, batch: int = 10_000) -> Iterable[dict[str, Any]]:
    """Every step row of the campaign's current version, streamed (for export)."""
    pairs = list_attempts(s, c)
    for run, a in pairs:
        nodes = attempt_node_count(a)
        q = (sa.select(StepMetric.step, StepMetric.tokens, *(getattr(StepMetric, f) for f in METRIC_FIELDS))
             .where(StepMetric.attempt_id == a.id).order_by(StepMetric.step).execution_options(yield_per=batch))
        for row in s.execute(q):
            out = {"stage": run.name, "attempt": a.number, "label": a.label, "nodes": nodes, "step": row[0],
                   "tokens": a.tokens_base + row[1], "attempt_tokens": row[1]}
            out.update(zip(METRIC_FIELDS, row[2:]))
            yield out


def list_campaign_nodes(s: Session, c: Campaign) -> list[dict[str, Any]]:
    """Per node the campaign used: attempts on it, failed ones, times named a suspect, and
    its active exclusion on the campaign's site (if any)."""
    excluded = {e.node: e for e in list_exclusions(s, c.site)}
    nodes: dict[str, dict[str, Any]] = {}
    for _, a in list_attempts(s, c):
        for n in a.nodes or []:
            d = nodes.setdefault(n, {"node": n, "attempts": 0, "failed": 0, "suspect": 0})
            d["attempts"] += 1
            d["failed"] += a.state not in ("succeeded", "running")
        for x in a.suspects or []:
            if isinstance(x, dict) and x.get("node"):
                nodes.setdefault(x["node"], {"node": x["node"], "attempts": 0, "failed": 0, "suspect": 0})["suspect"] += 1
    for n in excluded:
        nodes.setdefault(n, {"node": n, "attempts": 0, "failed": 0, "suspect": 0})
    for n, d in nodes.items():
        e = excluded.get(n)
        d["excluded"] = e is not None
        d["reason"] = e.reason if e else None
    return [nodes[n] for n in sorted(nodes)]


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
        a.state, a.exit_code, a.finished = "succeeded", 0, a.started
    for run in by_name.values():
        set_stage_state(s, run, "passed", verdict=f"imported from {source}")
    set_campaign_state(s, c, "succeeded", f"imported from {source}")
    return c


def _iso(t: dt.datetime | None) -> str | None:
    return t.strftime("%Y-%m-%d %H:%M:%S") if t is not None else None


# --- campaign lists (the CLI and the remote endpoint functions share these) -------------

def summarize_campaign_row(s: Session, c: Campaign) -> dict[str, Any]:
    """One line of `campaign status` (no NAME): the campaign, the stage it reached, its totals."""
    runs = current_stage_runs(s, c)
    reached = next((r for r in reversed(runs) if r.state not in ("pending", "skipped")), None)
    return {"name": c.name, "site": c.site, "state": c.state, "stage": reached.name if reached else None,
            # An imported run's stages continue one another (cumulative tokens): its total is the largest.
            "tokens": int(max((r.tokens for r in runs), default=0) if c.site == "imported" else sum(r.tokens for r in runs)),
            "last_loss": reached.last_loss if reached else None,
            "updated": c.updated.strftime("%Y-%m-%d %H:%M")}


def require_campaign(s: Session, name: str, display_url: str) -> Campaign:
    """The campaign named `name`, or a CampaignError that lists the ledger's campaigns."""
    c = get_campaign(s, name)
    if c is None:
        known = ", ".join(x.name for x in list_campaigns(s)) or "none"
        raise CampaignError(f"no campaign named {name!r} in {display_url} (campaigns: {known})")
    return c


def find_campaigns(s: Session, patterns: Sequence[str], display_url: str) -> list[Campaign]:
    """Campaigns named by NAME arguments; shell-style wildcards (`auroragpt-*`) allowed."""
    import fnmatch

    every = sorted(list_campaigns(s), key=lambda c: c.name)
    found: list[Any] = []
    for pat in patterns:
        hits = [c for c in every if fnmatch.fnmatchcase(c.name, pat)]
        if not hits:
            known = ", ".join(c.name for c in every) or "none"
            raise CampaignError(f"no campaign named {pat!r} in {display_url} (campaigns: {known})")
        found += [c for c in hits if c not in found]
    return found


def busiest_stage(s: Session, c: Campaign) -> str | None:
    """The stage with the most steps (what a `steps` plot shows by default)."""
    runs = [r for r in current_stage_runs(s, c) if r.steps]
    return max(runs, key=lambda r: (r.steps, r.attempts_count)).name if runs else None
