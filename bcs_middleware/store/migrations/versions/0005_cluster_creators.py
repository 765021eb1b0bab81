"""clusters.created_by: who registered each cluster, for the per-user cluster quota

Revision ID: 0005_cluster_creators
Revises: 0004_agent_tunnels
Create Date: 2026-12-01 09:00:00

Clusters registered before this revision get the creator the audit trail names
(the latest ``cluster.create`` of that id whose actor still exists), so an upgrade
does not reset anyone's count; a cluster without one counts for nobody.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005_cluster_creators'
down_revision = '0004_agent_tunnels'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN, never a batch rebuild: SQLite rebuilds by dropping the table, and
    # with foreign keys on that drop deletes every register token, credential, permission
    # and placement referencing it (so the column has no foreign key: models.py).
    op.add_column('clusters', sa.Column('created_by', sa.Integer(), nullable=True))
    op.create_index(op.f('ix_clusters_created_by'), 'clusters', ['created_by'], unique=False)
    _creators_from_the_audit_trail()


def _creators_from_the_audit_trail() -> None:
    audit = sa.table('audit_log', sa.column('id', sa.Integer), sa.column('actor', sa.String),
                     sa.column('action', sa.String), sa.column('target', sa.String))
    users = sa.table('users', sa.column('id', sa.Integer), sa.column('name', sa.String))
    clusters = sa.table('clusters', sa.column('id', sa.String), sa.column('created_by', sa.Integer))
    conn = op.get_bind()
    user_ids = {name: uid for uid, name in conn.execute(sa.select(users.c.id, users.c.name))}
    cluster_ids = set(conn.execute(sa.select(clusters.c.id)).scalars())
    creators: dict[str, int] = {}
    rows = conn.execute(sa.select(audit.c.actor, audit.c.target).where(audit.c.action == 'cluster.create')
                        .order_by(audit.c.id))
    for actor, target in rows:  # the latest creation of an id wins (an id deleted and registered again)
        cluster_id = target.removeprefix('cluster:')
        if cluster_id in cluster_ids:
            if actor in user_ids:
                creators[cluster_id] = user_ids[actor]
            else:
                creators.pop(cluster_id, None)
    for cluster_id, user_id in creators.items():
        conn.execute(sa.update(clusters).where(clusters.c.id == cluster_id).values(created_by=user_id))


def downgrade() -> None:
    op.drop_index(op.f('ix_clusters_created_by'), table_name='clusters')
    op.drop_column('clusters', 'created_by')
