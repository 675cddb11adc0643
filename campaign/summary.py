"""What `campaign status [NAME] --json` prints: the ledger's rows with their goodput.

    with ledger.session() as s:
        summary = summarize_campaign(s, c)     # scripts rely on the shape: add keys, never change them
        detail = describe_campaign(s, c)       # the same, plus what `campaign status NAME` shows

The queries are `campaign.ledger.reads`'; goodput (`campaign.goodput`: where the time went, the
checkpoint interval Young/Daly suggests) is added here, so the ledger's reads need no goodput.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from campaign import goodput
from campaign.ledger import reads
from campaign.ledger.models import Campaign


def summarize_campaign(s: Session, c: Campaign) -> dict[str, Any]:
    """The shape `campaign status NAME --json` prints (scripts rely on it: add keys, never change them)."""
    stages = [
        {"name": r.name, "kind": r.kind, "state": r.state, "attempts": r.attempts_count, "tokens": int(r.tokens),
         "last_loss": reads.jsonable(r.last_loss), "verdict": r.verdict}
        for r in reads.current_stage_runs(s, c)
    ]
    excluded = sorted({e.node for e in reads.list_exclusions(s, c.site, for_campaign=c.id)})
    out = {"name": c.name, "state": c.state, "stages": stages, "excluded_nodes": excluded}
    return goodput.add_to_summary(s, c, out, rescue_covers=_rescue_covers(c))


def _rescue_covers(c: Campaign) -> Callable[[int], bool]:
    """`contract.rescue_covers` for the campaign's stored spec, by node count (never, where
    the stored spec no longer validates). The spec is validated only when asked: for a long
    run's interval, not for every campaign `status` lists."""
    def covers(nodes: int) -> bool:
        from pydantic import ValidationError

        from campaign import contract
        from campaign.spec import CampaignSpec

        try:
            spec = CampaignSpec.model_validate(c.spec_json or {})
        except ValidationError:
            return False
        return contract.rescue_covers(spec.trainer, spec.site, nodes)

    return covers


def describe_campaign(s: Session, c: Campaign, *, events: int = 10) -> dict[str, Any]:
    """`summarize_campaign` plus the detail `campaign status NAME` shows, in NEW keys only:
    site, version, updated, attempts_detail, stage_numbers, exclusions, scaling, events,
    warnings (one line per attempt whose metrics.jsonl held rows that were skipped), driver
    (`driver_info`) and running (`live_attempt` of each running attempt)."""
    out = summarize_campaign(s, c)
    runs = reads.current_stage_runs(s, c)
    out["site"], out["version"], out["updated"] = c.site, c.version, reads.iso_time(c.updated)
    pairs = reads.list_attempts(s, c)
    out["attempts_detail"] = [reads.describe_attempt(r, a) for r, a in pairs]
    out["warnings"] = reads.attempt_warnings(pairs)
    out["stage_numbers"] = {r.name: reads.jsonable(r.numbers or {}) for r in runs}
    out["exclusions"] = [
        {"node": e.node, "reason": e.reason, "since": reads.iso_time(e.created), "expires": reads.iso_time(e.expires),
         "attempt_id": e.attempt_id, "campaign_only": e.campaign_id is not None}
        for e in reads.list_exclusions(s, c.site, for_campaign=c.id)
    ]
    out["scaling"] = [{"stage": r.name, "rows": reads.jsonable(r.numbers["table"])}
                      for r in runs if r.kind == "scaling" and isinstance((r.numbers or {}).get("table"), list)]
    out["events"] = [{"time": reads.iso_time(e.created), "kind": e.kind, "message": e.message}
                     for e in reads.list_news(s, c, limit=events)]
    out["driver"] = driver_info(s, c)
    out["running"] = [live_attempt(s, r, a) for r, a in pairs if a.state == "running"]
    return out


def driver_info(s: Session, c: Campaign) -> dict[str, Any]:
    """Who drives the campaign: {"state": "live" | "gone" | "none", "host", "pid"}. `gone`:
    the ledger says running, but its driver's lease is stale or its process is not there
    (this host), or no lease is held at all: only `campaign resume` moves it on."""
    from campaign.lease import is_live
    from campaign.ledger.models import db_utcnow

    lease = reads.get_lease(s, c)
    if lease is not None and is_live(lease, db_utcnow(s)):
        return {"state": "live", "host": lease.host, "pid": lease.pid}
    if c.state == "running":
        return {"state": "gone", "host": lease.host if lease else None, "pid": lease.pid if lease else None}
    return {"state": "none", "host": None, "pid": None}


RATE_WINDOW = 20
"""Steps back from the newest one over which status measures a running attempt's rate."""


def live_attempt(s: Session, run: Any, a: Any) -> dict[str, Any]:
    """A running attempt as `status` shows it: step/target, tokens, loss, tokens/s, seconds
    per step and the ETA (over the last RATE_WINDOW steps: two indexed step rows), its nodes."""
    out = {"stage": run.name, "number": a.number, "label": a.label, "step": a.last_step, "target": a.target_steps,
           "tokens": int(a.tokens_base + a.tokens) if a.last_step is not None else None,
           "loss": reads.jsonable(a.last_loss), "nodes": list(a.nodes or []), "node_count": len(a.nodes or []),
           "started": reads.iso_time(a.started), "run_dir": a.run_dir or None, "tokens_per_s": None,
           "step_time_s": None, "eta_s": None, "last_step_age_s": None, "mfu": None, "mfu_float8": None}
    if a.last_step is None:
        return out
    back = max(a.first_step or a.last_step, a.last_step - RATE_WINDOW)
    rows = reads.get_step_rows(s, a.id, {a.last_step, back})
    last, first = rows.get(a.last_step), rows.get(back)
    per_step = None
    if last is not None and first is not None and last.step > first.step and last.time and first.time \
            and last.time > first.time:
        per_step = (last.time - first.time) / (last.step - first.step)  # wall time: logging and saves included
    elif last is not None and last.step_time_s:
        per_step = last.step_time_s
    if last is not None and last.time:
        import time

        out["last_step_age_s"] = max(time.time() - last.time, 0.0)  # the trainer's clock: hosts kept in step (NTP)
    if last is not None:
        out["tokens_per_s"] = reads.jsonable(last.tokens_per_s)
        out["mfu"] = reads.jsonable(last.mfu)
        out["mfu_float8"] = reads.jsonable(last.mfu_float8)
        if not out["tokens_per_s"] and first is not None and per_step and last.step > first.step:
            out["tokens_per_s"] = (last.tokens - first.tokens) / (per_step * (last.step - first.step))
    out["step_time_s"] = per_step
    if per_step is not None and a.target_steps:
        out["eta_s"] = max(a.target_steps - a.last_step, 0) * per_step
    return out
