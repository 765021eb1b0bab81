"""recording heartbeats: the last sign of life of a session's writer; sizes past 2 GiB

Revision ID: 0009_recording_heartbeats
Revises: 0008_group_permissions
Create Date: 2026-11-28 09:00:00

``session_recordings.heartbeat_at``: when the process writing a session last said it is
alive, so any instance can end (``interrupted``) a session whose writer died; ``size``
becomes a 64-bit integer (a recording may outgrow PostgreSQL's ``integer``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009_recording_heartbeats'
down_revision = '0008_group_permissions'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('session_recordings', schema=None) as batch_op:
        batch_op.add_column(sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.alter_column('size', existing_type=sa.Integer(), type_=sa.BigInteger(), existing_nullable=False)
        batch_op.create_index(batch_op.f('ix_session_recordings_status'), ['status'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('session_recordings', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_session_recordings_status'))
        batch_op.alter_column('size', existing_type=sa.BigInteger(), type_=sa.Integer(), existing_nullable=False)
        batch_op.drop_column('heartbeat_at')
