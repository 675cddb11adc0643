"""Lease: one row per campaign naming the orchestrator process that drives it; campaign.spec_dir.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0002'
down_revision: Union[str, Sequence[str], None] = '0001'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table('lease',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('campaign_id', sa.Integer(), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('token', sa.String(length=64), nullable=False),
    sa.Column('renewed', sa.DateTime(), nullable=False),
    sa.Column('ttl_s', sa.Float(), nullable=False),
    sa.Column('created', sa.DateTime(), nullable=False),
    sa.Column('updated', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['campaign_id'], ['campaign.id'], name=op.f('fk_lease_campaign_id_campaign'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_lease')),
    sa.UniqueConstraint('campaign_id', name=op.f('uq_lease_campaign_id'))
    )
    with op.batch_alter_table('campaign') as batch_op:
        batch_op.add_column(sa.Column('spec_dir', sa.Text(), nullable=False, server_default=''))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table('campaign') as batch_op:
        batch_op.drop_column('spec_dir')
    op.drop_table('lease')
