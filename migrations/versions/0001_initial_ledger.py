"""Initial ledger: campaign, stage_run, attempt, step_metric, checkpoint, exclusion, event.

Revision ID: 0001
Revises: 
Create Date: 2026-11-29

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0001'
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table('campaign',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('spec_digest', sa.String(length=64), nullable=False),
    sa.Column('spec_json', sa.JSON(), nullable=False),
    sa.Column('spec_source', sa.Text(), nullable=False),
    sa.Column('site', sa.String(length=32), nullable=False),
    sa.Column('workdir', sa.Text(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('created', sa.DateTime(), nullable=False),
    sa.Column('updated', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_campaign')),
    sa.UniqueConstraint('name', name=op.f('uq_campaign_name'))
    )
    op.create_table('stage_run',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('campaign_id', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('verdict', sa.Text(), nullable=True),
    sa.Column('numbers', sa.JSON(), nullable=False),
    sa.Column('attempts_count', sa.Integer(), nullable=False),
    sa.Column('tokens', sa.BigInteger(), nullable=False),
    sa.Column('steps', sa.Integer(), nullable=False),
    sa.Column('last_loss', sa.Float(), nullable=True),
    sa.Column('started', sa.DateTime(), nullable=True),
    sa.Column('finished', sa.DateTime(), nullable=True),
    sa.Column('created', sa.DateTime(), nullable=False),
    sa.Column('updated', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['campaign_id'], ['campaign.id'], name=op.f('fk_stage_run_campaign_id_campaign'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_stage_run')),
    sa.UniqueConstraint('campaign_id', 'version', 'name', name=op.f('uq_stage_run_campaign_id'))
    )
    with op.batch_alter_table('stage_run', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_stage_run_campaign_id'), ['campaign_id'], unique=False)

    op.create_table('attempt',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('stage_run_id', sa.Integer(), nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=24), nullable=False),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('nodes', sa.JSON(), nullable=False),
    sa.Column('ranks_per_node', sa.Integer(), nullable=False),
    sa.Column('run_dir', sa.Text(), nullable=False),
    sa.Column('label', sa.String(length=64), nullable=False),
    sa.Column('first_step', sa.Integer(), nullable=True),
    sa.Column('last_step', sa.Integer(), nullable=True),
    sa.Column('tokens', sa.BigInteger(), nullable=False),
    sa.Column('tokens_base', sa.BigInteger(), nullable=False),
    sa.Column('last_loss', sa.Float(), nullable=True),
    sa.Column('suspects', sa.JSON(), nullable=False),
    sa.Column('summary', sa.JSON(), nullable=False),
    sa.Column('started', sa.DateTime(), nullable=False),
    sa.Column('finished', sa.DateTime(), nullable=True),
    sa.Column('created', sa.DateTime(), nullable=False),
    sa.Column('updated', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['stage_run_id'], ['stage_run.id'], name=op.f('fk_attempt_stage_run_id_stage_run'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_attempt')),
    sa.UniqueConstraint('stage_run_id', 'number', name=op.f('uq_attempt_stage_run_id'))
    )
    with op.batch_alter_table('attempt', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_attempt_stage_run_id'), ['stage_run_id'], unique=False)

    op.create_table('checkpoint',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('stage_run_id', sa.Integer(), nullable=False),
    sa.Column('attempt_id', sa.Integer(), nullable=True),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('tokens', sa.BigInteger(), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('complete', sa.Boolean(), nullable=False),
    sa.Column('created', sa.DateTime(), nullable=False),
    sa.Column('updated', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['attempt_id'], ['attempt.id'], name=op.f('fk_checkpoint_attempt_id_attempt'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['stage_run_id'], ['stage_run.id'], name=op.f('fk_checkpoint_stage_run_id_stage_run'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_checkpoint')),
    sa.UniqueConstraint('stage_run_id', 'path', name=op.f('uq_checkpoint_stage_run_id'))
    )
    with op.batch_alter_table('checkpoint', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_checkpoint_stage_run_id'), ['stage_run_id'], unique=False)

    op.create_table('event',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('created', sa.DateTime(), nullable=False),
    sa.Column('campaign_id', sa.Integer(), nullable=False),
    sa.Column('stage_run_id', sa.Integer(), nullable=True),
    sa.Column('attempt_id', sa.Integer(), nullable=True),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('data', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['attempt_id'], ['attempt.id'], name=op.f('fk_event_attempt_id_attempt'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['campaign_id'], ['campaign.id'], name=op.f('fk_event_campaign_id_campaign'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['stage_run_id'], ['stage_run.id'], name=op.f('fk_event_stage_run_id_stage_run'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_event'))
    )
    with op.batch_alter_table('event', schema=None) as batch_op:
        batch_op.create_index('ix_event_campaign_id_id', ['campaign_id', 'id'], unique=False)

    op.create_table('exclusion',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('site', sa.String(length=32), nullable=False),
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('evidence', sa.JSON(), nullable=False),
    sa.Column('attempt_id', sa.Integer(), nullable=True),
    sa.Column('expires', sa.DateTime(), nullable=True),
    sa.Column('lifted', sa.DateTime(), nullable=True),
    sa.Column('created', sa.DateTime(), nullable=False),
    sa.Column('updated', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['attempt_id'], ['attempt.id'], name=op.f('fk_exclusion_attempt_id_attempt'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_exclusion'))
    )
    with op.batch_alter_table('exclusion', schema=None) as batch_op:
        batch_op.create_index('ix_exclusion_site_node', ['site', 'node'], unique=False)

    op.create_table('step_metric',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('attempt_id', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('tokens', sa.BigInteger(), nullable=False),
    sa.Column('loss', sa.Float(), nullable=True),
    sa.Column('step_time_s', sa.Float(), nullable=True),
    sa.Column('tokens_per_s', sa.Float(), nullable=True),
    sa.Column('mfu', sa.Float(), nullable=True),
    sa.Column('comm_time_s', sa.Float(), nullable=True),
    sa.Column('mem_peak_gib', sa.Float(), nullable=True),
    sa.Column('lr', sa.Float(), nullable=True),
    sa.Column('grad_norm', sa.Float(), nullable=True),
    sa.Column('time', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['attempt_id'], ['attempt.id'], name=op.f('fk_step_metric_attempt_id_attempt'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_step_metric')),
    sa.UniqueConstraint('attempt_id', 'step', name=op.f('uq_step_metric_attempt_id'))
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table('step_metric')
    with op.batch_alter_table('exclusion', schema=None) as batch_op:
        batch_op.drop_index('ix_exclusion_site_node')

    op.drop_table('exclusion')
    with op.batch_alter_table('event', schema=None) as batch_op:
        batch_op.drop_index('ix_event_campaign_id_id')

    op.drop_table('event')
    with op.batch_alter_table('checkpoint', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_checkpoint_stage_run_id'))

    op.drop_table('checkpoint')
    with op.batch_alter_table('attempt', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_attempt_stage_run_id'))

    op.drop_table('attempt')
    with op.batch_alter_table('stage_run', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_stage_run_campaign_id'))

    op.drop_table('stage_run')
    op.drop_table('campaign')
