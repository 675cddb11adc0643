"""Ledger rows (SQLAlchemy 2 typed ORM). Migrations live in `migrations/`; read models in
`campaign.ledger.reads`, units of work in `campaign.ledger.writes`.

    campaign 1─* stage_run 1─* attempt 1─* step_metric
                                      1─* checkpoint
    campaign 1─* event (append-only history; stage_run / attempt optional)
    exclusion (per site and node: reason, evidence, expiry; a drill's: one campaign only)
    lease (one per campaign: the driver process driving it now)

Current state lives on the row (`state`, counters such as `tokens` and `last_loss`, kept
up to date at ingestion so `campaign status` never scans metrics); history lives in
`event`. Every row has `id`; every row but `step_metric` has `created`/`updated`
(a step row is written once, and there may be millions of them).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, MetaData, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from campaign import names

# Alembic batch mode on SQLite recreates tables and needs named constraints.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def db_utcnow(s: Any) -> dt.datetime:
    """The ledger's own clock (naive UTC) in session `s`: on PostgreSQL the server's, which
    every driver on every host shares, so a lease's age does not depend on which host's clock
    is right; on SQLite (in-process) this host's, as `utcnow`."""
    if s.get_bind().dialect.name == "postgresql":
        from sqlalchemy import text

        return s.scalar(text("SELECT (now() AT TIME ZONE 'UTC')::timestamp"))  # type: ignore[no-any-return]
    return utcnow()


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Timestamped:
    created: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated: Mapped[dt.datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Campaign(Timestamped, Base):
    """One campaign: a named spec and its whole history."""

    __tablename__ = "campaign"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(names.MAX_LENGTH), unique=True)
    version: Mapped[int] = mapped_column(default=1)
    spec_digest: Mapped[str] = mapped_column(String(64))
    spec_json: Mapped[dict[str, Any]]
    spec_source: Mapped[str] = mapped_column(Text, default="")
    # Where the campaign file was (relative reference files resolve against it on resume).
    spec_dir: Mapped[str] = mapped_column(Text, default="")
    site: Mapped[str] = mapped_column(String(32))
    workdir: Mapped[str] = mapped_column(Text)
    # pending | running | succeeded | failed | cancelled
    state: Mapped[str] = mapped_column(String(16), default="pending")
    # Where the wall time went (campaign.goodput), updated at each attempt's and stage's end.
    goodput: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    stage_runs: Mapped[list[StageRun]] = relationship(back_populates="campaign", order_by="StageRun.position")


class StageRun(Timestamped, Base):
    """One stage of one version of a campaign, with its current state and verdict."""

    __tablename__ = "stage_run"
    __table_args__ = (UniqueConstraint("campaign_id", "version", "name"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaign.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(default=1)
    position: Mapped[int]
    name: Mapped[str] = mapped_column(String(names.MAX_LENGTH))
    kind: Mapped[str] = mapped_column(String(32))
    # pending | running | passed | failed | skipped
    state: Mapped[str] = mapped_column(String(16), default="pending")
    verdict: Mapped[str | None] = mapped_column(Text)
    numbers: Mapped[dict[str, Any]] = mapped_column(default=dict)
    attempts_count: Mapped[int] = mapped_column(default=0)
    tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    steps: Mapped[int] = mapped_column(default=0)
    last_loss: Mapped[float | None] = mapped_column(Float)
    started: Mapped[dt.datetime | None]
    finished: Mapped[dt.datetime | None]
    goodput: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    campaign: Mapped[Campaign] = relationship(back_populates="stage_runs")
    attempts: Mapped[list[Attempt]] = relationship(back_populates="stage_run", order_by="Attempt.number")


class Attempt(Timestamped, Base):
    """One launch of the trainer for a stage."""

    __tablename__ = "attempt"
    __table_args__ = (UniqueConstraint("stage_run_id", "number"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    stage_run_id: Mapped[int] = mapped_column(ForeignKey("stage_run.id", ondelete="CASCADE"), index=True)
    number: Mapped[int]
    # running, or an exit class (campaign.exits.ExitClass): succeeded, stalled, crashed_node, crashed_unknown, ...
    state: Mapped[str] = mapped_column(String(24), default="running")
    exit_code: Mapped[int | None]
    nodes: Mapped[list[Any]] = mapped_column(default=list)
    ranks_per_node: Mapped[int] = mapped_column(default=1)
    run_dir: Mapped[str] = mapped_column(Text)
    label: Mapped[str] = mapped_column(String(64), default="")
    # The step the attempt trains to (what `status` shows as step/target and its ETA from).
    target_steps: Mapped[int | None]
    first_step: Mapped[int | None]
    last_step: Mapped[int | None]
    tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    # Stage tokens before this attempt's first step: 0-based for a fresh run, the chain's
    # base when it resumes an earlier attempt's checkpoint (so totals continue, not double).
    tokens_base: Mapped[int] = mapped_column(BigInteger, default=0)
    last_loss: Mapped[float | None] = mapped_column(Float)
    suspects: Mapped[list[Any]] = mapped_column(default=list)
    summary: Mapped[dict[str, Any]] = mapped_column(default=dict)
    started: Mapped[dt.datetime] = mapped_column(default=utcnow)
    finished: Mapped[dt.datetime | None]
    goodput: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    stage_run: Mapped[StageRun] = relationship(back_populates="attempts")


class StepMetric(Base):
    """One training step of one attempt, as the trainer reported it. Unique per attempt+step."""

    __tablename__ = "step_metric"
    __table_args__ = (UniqueConstraint("attempt_id", "step"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempt.id", ondelete="CASCADE"))
    step: Mapped[int]
    tokens: Mapped[int] = mapped_column(BigInteger)
    loss: Mapped[float | None] = mapped_column(Float)
    step_time_s: Mapped[float | None] = mapped_column(Float)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    mfu: Mapped[float | None] = mapped_column(Float)
    comm_time_s: Mapped[float | None] = mapped_column(Float)
    mem_peak_gib: Mapped[float | None] = mapped_column(Float)
    lr: Mapped[float | None] = mapped_column(Float)
    grad_norm: Mapped[float | None] = mapped_column(Float)
    time: Mapped[float | None] = mapped_column(Float)
    mfu_float8: Mapped[float | None] = mapped_column(Float)
    """Last, where migration 0005 added it: a CSV export read by position keeps its columns."""


class Checkpoint(Timestamped, Base):
    """A checkpoint an attempt wrote; `complete` once every rank finished it."""

    __tablename__ = "checkpoint"
    __table_args__ = (UniqueConstraint("stage_run_id", "path"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    stage_run_id: Mapped[int] = mapped_column(ForeignKey("stage_run.id", ondelete="CASCADE"), index=True)
    attempt_id: Mapped[int | None] = mapped_column(ForeignKey("attempt.id", ondelete="SET NULL"))
    step: Mapped[int]
    tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    path: Mapped[str] = mapped_column(Text)
    complete: Mapped[bool] = mapped_column(default=False)


class Exclusion(Timestamped, Base):
    """A node not to use on a site: why, the evidence, and until when. `campaign_id` set:
    only that campaign avoids the node (a drill's exclusion), and it goes with the campaign."""

    __tablename__ = "exclusion"
    __table_args__ = (Index("ix_exclusion_site_node", "site", "node"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    site: Mapped[str] = mapped_column(String(32))
    node: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text)
    evidence: Mapped[dict[str, Any]] = mapped_column(default=dict)
    attempt_id: Mapped[int | None] = mapped_column(ForeignKey("attempt.id", ondelete="SET NULL"))
    campaign_id: Mapped[int | None] = mapped_column(ForeignKey("campaign.id", ondelete="CASCADE"), index=True)
    expires: Mapped[dt.datetime | None]
    lifted: Mapped[dt.datetime | None]


class Event(Base):
    """Append-only history: every transition and every watchdog action."""

    __tablename__ = "event"
    __table_args__ = (Index("ix_event_campaign_id_id", "campaign_id", "id"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    created: Mapped[dt.datetime] = mapped_column(default=utcnow)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaign.id", ondelete="CASCADE"))
    stage_run_id: Mapped[int | None] = mapped_column(ForeignKey("stage_run.id", ondelete="CASCADE"))
    attempt_id: Mapped[int | None] = mapped_column(ForeignKey("attempt.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)


class Lease(Timestamped, Base):
    """Which driver process drives a campaign now. Renewed while it runs; a lease
    not renewed for `ttl_s` is stale and may be taken over (the driver died)."""

    __tablename__ = "lease"
    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaign.id", ondelete="CASCADE"), unique=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int]
    token: Mapped[str] = mapped_column(String(64))
    renewed: Mapped[dt.datetime] = mapped_column(default=utcnow)
    ttl_s: Mapped[float] = mapped_column(Float, default=60.0)
