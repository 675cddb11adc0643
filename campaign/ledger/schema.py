"""Alembic, driven from code: the migration scripts ship inside the package
(`campaign.migrations`), so `campaign db upgrade` works from an installed wheel.
"""

from __future__ import annotations

from importlib import resources

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from campaign.errors import SchemaOutOfDate


def alembic_config(engine: sa.Engine | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("campaign.migrations")))
    if engine is not None:
        cfg.attributes["engine"] = engine
    return cfg


def head_revision() -> str:
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    assert len(heads) == 1, f"migrations must have a single head, found {heads}"
    return heads[0]


def current_revision(conn: sa.Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: sa.Engine, revision: str = "head", *, one_transaction: bool = False) -> None:
    """Migrate to `revision`. `one_transaction`: every migration in one transaction, even on
    SQLite (Alembic's default there is one per migration; see `db.create_schema`)."""
    cfg = alembic_config(engine)
    cfg.attributes["one_transaction"] = one_transaction
    command.upgrade(cfg, revision)


def downgrade(engine: sa.Engine, revision: str) -> None:
    command.downgrade(alembic_config(engine), revision)


def check(engine: sa.Engine, current: str | None, url: str) -> None:
    """Refuse a ledger whose schema is not this release's head."""
    head = head_revision()
    if current == head:
        return
    script = ScriptDirectory.from_config(alembic_config())
    known = {rev.revision for rev in script.walk_revisions()}
    shown = engine.url.render_as_string(hide_password=True)
    if current is not None and current not in known:
        raise SchemaOutOfDate(
            f"the ledger at {shown} is at schema revision {current}, which this release of campaign does not know; "
            "it was written by a newer campaign: upgrade campaign"
        )
    raise SchemaOutOfDate(
        f"the ledger at {shown} is at schema revision {current or '(none)'}, this release needs {head}; "
        f"upgrade it with: campaign db upgrade --db '{url}'"
    )
