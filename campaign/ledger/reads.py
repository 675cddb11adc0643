"""The ledger's read models: every query that only reads, as `verb_noun(session, ...)`.

Status reads only campaign / stage_run / attempt / exclusion / event rows (their counters),
never step_metric. Plot queries downsample in SQL on the (attempt_id, step) unique index,
so a 1,000,000-step campaign costs a few thousand rows, not a million. Units of work that
change the ledger are in `campaign.ledger.writes`.
"""

from __future__ import annotations

import datetime as dt
import math
import statistics
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from campaign.errors import CampaignError
from campaign.exits import ExitClass
from campaign.fields import METRIC_FIELDS, MFU, MFU_FLOAT8  # the float columns of step_metric, in column order
from campaign.ledger.models import Attempt, Campaign, Event, Exclusion, Lease, StageRun, StepMetric, utcnow


def get_campaign(s: Session, name: str) -> Campaign | None:
    return s.scalar(sa.select(Campaign).where(Campaign.name == name))


def list_campaigns(s: Session) -> Sequence[Campaign]:
    return s.scalars(sa.select(Campaign).order_by(Campaign.updated.desc())).all()


def current_stage_runs(s: Session, c: Campaign) -> Sequence[StageRun]:
    q = sa.select(StageRun).where(StageRun.campaign_id == c.id, StageRun.version == c.version)
    return s.scalars(q.order_by(StageRun.position)).all()


def get_stage_run(s: Session, campaign: str, stage: str) -> StageRun | None:
    """The newest stage run named `stage` of campaign `campaign` (any version)."""
    q = (sa.select(StageRun).join(Campaign).where(Campaign.name == campaign, StageRun.name == stage)
         .order_by(StageRun.version.desc()).limit(1))
    return s.scalar(q)


def list_steps(s: Session, attempt_id: int) -> Sequence[StepMetric]:
    q = sa.select(StepMetric).where(StepMetric.attempt_id == attempt_id).order_by(StepMetric.step)
    return s.scalars(q).all()


def measured_step_times(s: Session, stage_run_id: int, *, nodes: int, ranks_per_node: int, skip: int,
                        limit: int = 200) -> list[float]:
    """Step times this stage run already measured at this size: the `step_time_s` of its earlier
    attempts on `nodes` nodes x `ranks_per_node` (the same model, batch and ranks), each attempt's
    first `skip` steps left out (their warm-up), the newest `limit` in step order. A relaunch's
    watchdog starts from them (`watchdog.Watch.prior_step_times`)."""
    runs = s.execute(sa.select(Attempt.id, Attempt.nodes, Attempt.ranks_per_node, Attempt.summary)
                     .where(Attempt.stage_run_id == stage_run_id).order_by(Attempt.number.desc())).all()
    out: list[float] = []
    for attempt_id, names, rpn, summary in runs:
        if rpn != ranks_per_node or int((summary or {}).get("node_count") or len(names or [])) != nodes:
            continue
        q = (sa.select(StepMetric.step_time_s).where(StepMetric.attempt_id == attempt_id,
                                                     StepMetric.step_time_s.is_not(None))
             .order_by(StepMetric.step).offset(skip))
        out = [float(t) for t in s.scalars(q).all() if t > 0][-(limit - len(out)):] + out
        if len(out) >= limit:
            break
    return out[-limit:]


MFU_WINDOW = 200
"""Step rows (the newest of a stage run) whose median MFU `stage_mfu` reports: the steady
state, past the first steps' compilation, without reading a long run's every row."""


def stage_mfu(s: Session, stage_run_id: int, *, window: int = MFU_WINDOW) -> dict[str, float]:
    """The median model FLOPs utilisation over the newest `window` step rows of the stage run's
    attempts that have one, as the trainer computed it with nanoGPT's formula: `mfu` against its
    device's dense bf16 peak and, for a float8 run, `mfu_float8` against the float8 peak (one
    read of those rows for both). Empty when no row has one (a trainer that does not report it,
    or a device without a known peak, CPU among them)."""
    q = (sa.select(StepMetric.mfu, StepMetric.mfu_float8).join(Attempt, Attempt.id == StepMetric.attempt_id)
         .where(Attempt.stage_run_id == stage_run_id, StepMetric.mfu.is_not(None))
         .order_by(Attempt.number.desc(), StepMetric.step.desc()).limit(window))
    out = {}
    for name, values in zip((MFU, MFU_FLOAT8), zip(*s.execute(q).all())):
        finite = [float(v) for v in values if v is not None and math.isfinite(v)]
        if finite:
            out[name] = statistics.median(finite)
    return out


def list_exclusions(s: Session, site: str | None = None, *, active: bool = True, now: dt.datetime | None = None,
                    for_campaign: int | None = None) -> Sequence[Exclusion]:
    """Exclusions on `site` (every site if None), active ones only unless `active` is false.
    `for_campaign`: those that bind that campaign (site-wide ones and its own drills'); None:
    every scope (what `campaign nodes list` shows)."""
    q = sa.select(Exclusion)
    if site is not None:
        q = q.where(Exclusion.site == site)
    if for_campaign is not None:
        q = q.where(sa.or_(Exclusion.campaign_id.is_(None), Exclusion.campaign_id == for_campaign))
    if active:
        now = now or utcnow()
        q = q.where(Exclusion.lifted.is_(None), sa.or_(Exclusion.expires.is_(None), Exclusion.expires > now))
    return s.scalars(q.order_by(Exclusion.node)).all()


def get_lease(s: Session, c: Campaign) -> Lease | None:
    return s.scalar(sa.select(Lease).where(Lease.campaign_id == c.id))


def list_open_attempts(s: Session, c: Campaign) -> Sequence[Attempt]:
    """Attempts still marked running: after a driver crash these are orphans."""
    q = (sa.select(Attempt).join(StageRun).where(StageRun.campaign_id == c.id, Attempt.state == "running")
         .order_by(Attempt.id))
    return s.scalars(q).all()


def list_events(s: Session, c: Campaign, *, after_id: int = 0, limit: int = 1000) -> Sequence[Event]:
    q = sa.select(Event).where(Event.campaign_id == c.id, Event.id > after_id).order_by(Event.id).limit(limit)
    return s.scalars(q).all()


def event_record(ev: Event, *, campaign: str, version: int, stage: str | None, attempt: int | None) -> dict[str, Any]:
    """An event as the driver's observers see it (plain JSON: it goes to a notification
    command's stdin as it is): id (the ledger's order of events), kind, message, data,
    campaign, version, stage, attempt, time."""
    when = ev.created or utcnow()
    return {"id": ev.id, "kind": ev.kind, "message": ev.message, "data": ev.data or {}, "campaign": campaign, "version": version,
            "stage": stage, "attempt": attempt, "time": when.replace(tzinfo=dt.timezone.utc).isoformat()}


def list_event_records(s: Session, c: Campaign) -> Iterator[dict[str, Any]]:
    """Every event of the campaign, oldest first, as `event_record`s (what `ledger export
    --format tensorboard` replays)."""
    q = (sa.select(Event, StageRun.name, StageRun.version, Attempt.number)
         .outerjoin(StageRun, Event.stage_run_id == StageRun.id).outerjoin(Attempt, Event.attempt_id == Attempt.id)
         .where(Event.campaign_id == c.id).order_by(Event.id))
    for ev, stage, version, number in s.execute(q):
        yield event_record(ev, campaign=c.name, version=version or c.version, stage=stage, attempt=number)


def jsonable(value: Any) -> Any:
    """JSON columns reject NaN on Postgres; store non-finite floats as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


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
            "last_loss": jsonable(a.last_loss), "started": iso_time(a.started), "finished": iso_time(a.finished),
            "duration_s": duration, "suspects": [x.get("node") for x in (a.suspects or []) if isinstance(x, dict)],
            "bad_metric_rows": int(((a.summary or {}).get("bad_metric_rows") or {}).get("count") or 0),
            "detected_after_s": (a.summary or {}).get("detected_after_s"), "run_dir": a.run_dir or None}


FAULT_KEYS = ("stall", "first_failure", "rescue", "stragglers")
"""Keys of an attempt's summary shown as a fault's evidence (besides `error` and `finding`)."""


def describe_fault(run: StageRun, a: Attempt) -> dict[str, Any]:
    """An attempt that did not succeed, with what the evidence says (JSON-ready): its exit
    class and code, `what` (the finding's message, else the error), the finding's rule and
    signature, the suspect nodes with their reason and evidence, and the rest of the
    summary's evidence (the stall, the first failure, the rescue)."""
    summary = a.summary or {}
    finding = summary.get("finding") if isinstance(summary.get("finding"), dict) else {}
    return {"stage": run.name, "number": a.number, "label": a.label, "state": a.state, "exit_code": a.exit_code,
            "finished": iso_time(a.finished), "what": finding.get("message") or summary.get("error"),
            "rule": finding.get("rule"), "signature": finding.get("signature"),
            "detected_after_s": summary.get("detected_after_s"), "killed_by": summary.get("killed_by"),
            "suspects": [x for x in jsonable(a.suspects or []) if isinstance(x, dict)],
            "evidence": jsonable({k: summary[k] for k in FAULT_KEYS if summary.get(k)})}


def bad_rows_line(bad: dict[str, Any]) -> str:
    """What a user reads about an attempt's skipped rows (summary["bad_metric_rows"] or
    ["bad_event_rows"]): the count, the file, the first row's line and reason."""
    first = f"; first: {bad['examples'][0]}" if bad.get("examples") else ""
    what = "events" if str(bad.get("file", "")).endswith("events.jsonl") else "metrics rows"
    return f"{bad.get('count')} bad row(s) of {bad.get('file')} skipped (not valid {what}){first}"


def attempt_warnings(pairs: Sequence[tuple[StageRun, Attempt]]) -> list[str]:
    """One line per attempt and file (metrics.jsonl, events.jsonl) whose rows were skipped."""
    return [f"stage {run.name} attempt {a.number}: {bad_rows_line(bad)}" for run, a in pairs
            for key in ("bad_metric_rows", "bad_event_rows")
            if isinstance(bad := (a.summary or {}).get(key), dict) and bad.get("count")]


def list_news(s: Session, c: Campaign, *, limit: int = 10) -> Sequence[Event]:
    """The campaign's newest `limit` events other than routine ones, oldest first."""
    q = (sa.select(Event).where(Event.campaign_id == c.id, Event.kind.not_in(ROUTINE_EVENTS))
         .order_by(Event.id.desc()).limit(limit))
    return list(reversed(s.scalars(q).all()))


def list_stage_events(s: Session, run: StageRun, kinds: Sequence[str]) -> Sequence[Event]:
    """The events of kinds `kinds` of one stage run, oldest first."""
    q = sa.select(Event).where(Event.stage_run_id == run.id, Event.kind.in_(list(kinds))).order_by(Event.id)
    return s.scalars(q).all()


def get_step_rows(s: Session, attempt_id: int, steps: Sequence[int]) -> dict[int, StepMetric]:
    """The step rows of `steps` of one attempt, by the (attempt_id, step) unique index: a
    point lookup each, never a scan (status reads two per running attempt for its rate)."""
    q = sa.select(StepMetric).where(StepMetric.attempt_id == attempt_id, StepMetric.step.in_(list(steps)))
    return {m.step: m for m in s.scalars(q)}


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
    excluded = {e.node: e for e in list_exclusions(s, c.site, for_campaign=c.id)}
    nodes: dict[str, dict[str, Any]] = {}
    for _, a in list_attempts(s, c):
        for n in a.nodes or []:
            d = nodes.setdefault(n, {"node": n, "attempts": 0, "failed": 0, "suspect": 0})
            d["attempts"] += 1
            d["failed"] += a.state not in (ExitClass.SUCCEEDED, "running")
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


def iso_time(t: dt.datetime | None) -> str | None:
    return t.strftime("%Y-%m-%d %H:%M:%S") if t is not None else None


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
        raise no_campaign(name, list_campaigns(s), display_url)
    return c


def no_campaign(name: str, every: Sequence[Campaign], display_url: str) -> CampaignError:
    """The error for a NAME the ledger does not hold: it lists the campaigns it does hold."""
    known = ", ".join(sorted(c.name for c in every)) or "none"
    return CampaignError(f"no campaign named {name!r} in {display_url} (campaigns: {known})")


def find_campaigns(s: Session, patterns: Sequence[str], display_url: str) -> list[Campaign]:
    """Campaigns named by NAME arguments; shell-style wildcards (`auroragpt-*`) allowed."""
    import fnmatch

    every = sorted(list_campaigns(s), key=lambda c: c.name)
    found: list[Any] = []
    for pat in patterns:
        hits = [c for c in every if fnmatch.fnmatchcase(c.name, pat)]
        if not hits:
            raise no_campaign(pat, every, display_url)
        found += [c for c in hits if c not in found]
    return found


def busiest_stage(s: Session, c: Campaign) -> str | None:
    """The stage with the most steps (what a `steps` plot shows by default)."""
    runs = [r for r in current_stage_runs(s, c) if r.steps]
    return max(runs, key=lambda r: (r.steps, r.attempts_count)).name if runs else None
