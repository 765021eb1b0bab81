"""cluster permissions (view/edit per user per cluster) and the RBAC grants every process reads

Revision ID: 0003_cluster_permissions
Revises: 0002_rbac
Create Date: 2026-11-24 05:00:00

Clusters created before this revision have no permission rows: their creators
(the ``cluster.create`` entries of the audit trail) get ``edit``, so nobody who
managed a cluster loses it on upgrade.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = '0003_cluster_permissions'
down_revision = '0002_rbac'
branch_labels = None
depends_on = None


def upgrade() -> None:
    permissions = op.create_table('cluster_permissions',
    sa.Column('cluster_id', sa.String(length=128), nullable=False),
    sa.Column('user_id', sa.Integer(), nullable=False),
    sa.Column('permission', sa.String(length=8), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['cluster_id'], ['clusters.id'], name=op.f('fk_cluster_permissions_cluster_id_clusters'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_cluster_permissions_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('cluster_id', 'user_id', name=op.f('pk_cluster_permissions'))
    )
    with op.batch_alter_table('cluster_permissions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_cluster_permissions_user_id'), ['user_id'], unique=False)
    op.create_table('rbac_cluster_grants',
    sa.Column('subject_kind', sa.String(length=8), nullable=False),
    sa.Column('subject', sa.String(length=253), nullable=False),
    sa.Column('cluster', sa.String(length=128), nullable=False),
    sa.PrimaryKeyConstraint('subject_kind', 'subject', 'cluster', name=op.f('pk_rbac_cluster_grants'))
    )
    _creators_get_edit(permissions)


def _creators_get_edit(permissions: sa.Table) -> None:
    audit = sa.table('audit_log', sa.column('id', sa.Integer), sa.column('actor', sa.String),
                     sa.column('action', sa.String), sa.column('target', sa.String))
    users = sa.table('users', sa.column('id', sa.Integer), sa.column('name', sa.String))
    clusters = sa.table('clusters', sa.column('id', sa.String))
    conn = op.get_bind()
    user_ids = {name: uid for uid, name in conn.execute(sa.select(users.c.id, users.c.name))}
    cluster_ids = set(conn.execute(sa.select(clusters.c.id)).scalars())
    rows = conn.execute(sa.select(audit.c.actor, audit.c.target).where(audit.c.action == 'cluster.create')
                        .order_by(audit.c.id))
    wanted: dict[tuple[str, int], None] = {}
    for actor, target in rows:
        cluster_id = target.removeprefix('cluster:')
        if actor in user_ids and cluster_id in cluster_ids:
            wanted[(cluster_id, user_ids[actor])] = None
    now = datetime.now(UTC)
    if wanted:
        op.bulk_insert(permissions, [{'cluster_id': c, 'user_id': u, 'permission': 'edit', 'updated_at': now}
                                     for c, u in wanted])


def downgrade() -> None:
    op.drop_table('rbac_cluster_grants')
    with op.batch_alter_table('cluster_permissions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_cluster_permissions_user_id'))
    op.drop_table('cluster_permissions')
