"""session recordings: exec/attach sessions and their asciicast text, for recording_store = database

Revision ID: 0007_session_recordings
Revises: 0006_instance_checks
Create Date: 2026-11-28 05:30:00

``session_recordings`` describes each recorded session (who, which cluster, when, how it
ended, as JSON in ``info``; the columns a listing filters on beside it);
``session_recording_chunks`` holds its asciicast v2 text in the order it was written.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007_session_recordings'
down_revision = '0006_instance_checks'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('session_recordings',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('cluster_id', sa.String(length=128), nullable=False),
    sa.Column('user_name', sa.String(length=128), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('size', sa.Integer(), nullable=False),
    sa.Column('info', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_session_recordings'))
    )
    op.create_index(op.f('ix_session_recordings_cluster_id'), 'session_recordings', ['cluster_id'])
    op.create_index(op.f('ix_session_recordings_user_name'), 'session_recordings', ['user_name'])
    op.create_index(op.f('ix_session_recordings_started_at'), 'session_recordings', ['started_at'])
    op.create_table('session_recording_chunks',
    sa.Column('recording_id', sa.String(length=32), nullable=False),
    sa.Column('seq', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('data', sa.LargeBinary(), nullable=False),
    sa.ForeignKeyConstraint(['recording_id'], ['session_recordings.id'],
                            name=op.f('fk_session_recording_chunks_recording_id_session_recordings'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('recording_id', 'seq', name=op.f('pk_session_recording_chunks'))
    )


def downgrade() -> None:
    op.drop_table('session_recording_chunks')
    op.drop_index(op.f('ix_session_recordings_started_at'), table_name='session_recordings')
    op.drop_index(op.f('ix_session_recordings_user_name'), table_name='session_recordings')
    op.drop_index(op.f('ix_session_recordings_cluster_id'), table_name='session_recordings')
    op.drop_table('session_recordings')
