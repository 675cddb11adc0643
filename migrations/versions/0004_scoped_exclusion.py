"""A drill's exclusion scoped to its campaign (exclusion.campaign_id); attempt.target_steps.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-07

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0004'
down_revision: Union[str, Sequence[str], None] = '0003'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema: both columns nullable (every existing exclusion stays site-wide;
    existing attempts have no recorded target)."""
    with op.batch_alter_table('exclusion') as batch_op:
        batch_op.add_column(sa.Column('campaign_id', sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f('ix_exclusion_campaign_id'), ['campaign_id'], unique=False)
        batch_op.create_foreign_key(batch_op.f('fk_exclusion_campaign_id_campaign'), 'campaign', ['campaign_id'], ['id'],
                                    ondelete='CASCADE')
    with op.batch_alter_table('attempt') as batch_op:
        batch_op.add_column(sa.Column('target_steps', sa.Integer(), nullable=True))


def downgrade() -> None:
    """Downgrade schema. An older release cannot scope an exclusion to a campaign: the
    scoped ones (drills) are lifted first, never widened to the whole site."""
    op.execute(sa.text("UPDATE exclusion SET lifted = CURRENT_TIMESTAMP WHERE campaign_id IS NOT NULL AND lifted IS NULL"))
    with op.batch_alter_table('attempt') as batch_op:
        batch_op.drop_column('target_steps')
    with op.batch_alter_table('exclusion') as batch_op:
        batch_op.drop_constraint(batch_op.f('fk_exclusion_campaign_id_campaign'), type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_exclusion_campaign_id'))
        batch_op.drop_column('campaign_id')
