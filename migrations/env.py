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

with engine.connect() as connection:
    sqlite = connection.dialect.name == "sqlite"
    if sqlite:
        # Batch mode rebuilds a table by copy-and-rename; with foreign keys on, dropping the
        # old table would cascade-delete every child row. The PRAGMA only takes effect
        # outside a transaction, so it is set (and later restored) around the migration.
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
        connection.commit()
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=sqlite,
        compare_type=True,
        # A new ledger is created in one transaction (campaign.ledger.db.create_schema).
        transactional_ddl=True if config.attributes.get("one_transaction") else None,
    )
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
    if sqlite:
        connection.exec_driver_sql("PRAGMA foreign_keys=ON")
        connection.commit()
