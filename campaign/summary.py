"""What `campaign status [NAME] --json` prints: the ledger's rows with their goodput.

    with ledger.session() as s:
        summary = summarize_campaign(s, c)     # scripts rely on the shape: add keys, never change them
        detail = describe_campaign(s, c)       # the same, plus what `campaign status NAME` shows

The queries are `campaign.ledger.reads`'; goodput (`campaign.goodput`: where the time went, the
checkpoint interval Young/Daly suggests) is added here, so the ledger's reads need no goodput.
"""

from __future__ import annotations

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
    excluded = sorted({e.node for e in reads.list_exclusions(s, c.site)})
    out = {"name": c.name, "state": c.state, "stages": stages, "excluded_nodes": excluded}
    return goodput.add_to_summary(s, c, out)


def describe_campaign(s: Session, c: Campaign, *, events: int = 10) -> dict[str, Any]:
    """`summarize_campaign` plus the detail `campaign status NAME` shows, in NEW keys only:
    site, version, updated, attempts_detail, stage_numbers, exclusions, scaling, events,
    warnings (one line per attempt whose metrics.jsonl held rows that were skipped)."""
    out = summarize_campaign(s, c)
    runs = reads.current_stage_runs(s, c)
    out["site"], out["version"], out["updated"] = c.site, c.version, reads.iso_time(c.updated)
    pairs = reads.list_attempts(s, c)
    out["attempts_detail"] = [reads.describe_attempt(r, a) for r, a in pairs]
    out["warnings"] = reads.attempt_warnings(pairs)
    out["stage_numbers"] = {r.name: reads.jsonable(r.numbers or {}) for r in runs}
    out["exclusions"] = [
        {"node": e.node, "reason": e.reason, "since": reads.iso_time(e.created), "expires": reads.iso_time(e.expires),
         "attempt_id": e.attempt_id}
        for e in reads.list_exclusions(s, c.site)
    ]
    out["scaling"] = [{"stage": r.name, "rows": reads.jsonable(r.numbers["table"])}
                      for r in runs if r.kind == "scaling" and isinstance((r.numbers or {}).get("table"), list)]
    out["events"] = [{"time": reads.iso_time(e.created), "kind": e.kind, "message": e.message}
                     for e in reads.list_news(s, c, limit=events)]
    return out
