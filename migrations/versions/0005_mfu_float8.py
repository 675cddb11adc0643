"""step_metric.mfu_float8: a float8 run's MFU against its device's float8 dense peak.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0005'
down_revision: Union[str, Sequence[str], None] = '0004'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema: nullable (existing rows, bf16 runs and devices without a float8 peak
    have none)."""
    with op.batch_alter_table('step_metric') as batch_op:
        batch_op.add_column(sa.Column('mfu_float8', sa.Float(), nullable=True))


def downgrade() -> None:
    """Downgrade schema: the float8 figure goes; `mfu` (against the bf16 peak) stays."""
    with op.batch_alter_table('step_metric') as batch_op:
        batch_op.drop_column('mfu_float8')
