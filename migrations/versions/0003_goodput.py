"""Goodput: where each attempt's, stage's and campaign's wall time went (campaign.goodput).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0003'
down_revision: Union[str, Sequence[str], None] = '0002'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

TABLES = ('attempt', 'stage_run', 'campaign')


def upgrade() -> None:
    """Upgrade schema: a nullable JSON column per table (null until computed)."""
    for table in TABLES:
        with op.batch_alter_table(table) as batch_op:
            batch_op.add_column(sa.Column('goodput', sa.JSON(), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    for table in TABLES:
        with op.batch_alter_table(table) as batch_op:
            batch_op.drop_column('goodput')
