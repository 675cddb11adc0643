"""Alembic environment: runs migrations on the engine handed over by campaign.ledger.schema,
in batch mode on SQLite (ALTER TABLE there means copy-and-move)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from campaign.ledger.models import Base

config = context.config
engine = config.attributes.get("engine")
if engine is None:  # plain `alembic` CLI use: sqlalchemy.url from the ini or -x url=...
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    engine = engine_from_config({"sqlalchemy.url": url}, prefix="sqlalchemy.", poolclass=pool.NullPool)

with engine.begin() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()
