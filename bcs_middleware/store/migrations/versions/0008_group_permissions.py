"""group permissions: cluster view/edit held by a group

Revision ID: 0008_group_permissions
Revises: 0007_session_recordings
Create Date: 2026-11-28 06:00:00

``cluster_group_permissions`` gives every member of a group (as the user's authenticator
maps it: an identity provider's groups claim, a tokens file) ``view`` or ``edit`` on a
cluster, beside the per-user ``cluster_permissions``; the stronger of the two counts.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008_group_permissions'
down_revision = '0007_session_recordings'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('cluster_group_permissions',
    sa.Column('cluster_id', sa.String(length=128), nullable=False),
    sa.Column('group_name', sa.String(length=253), nullable=False),
    sa.Column('permission', sa.String(length=8), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['cluster_id'], ['clusters.id'],
                            name=op.f('fk_cluster_group_permissions_cluster_id_clusters'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('cluster_id', 'group_name', name=op.f('pk_cluster_group_permissions'))
    )
    op.create_index(op.f('ix_cluster_group_permissions_group_name'), 'cluster_group_permissions', ['group_name'],
                    unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_cluster_group_permissions_group_name'), table_name='cluster_group_permissions')
    op.drop_table('cluster_group_permissions')
