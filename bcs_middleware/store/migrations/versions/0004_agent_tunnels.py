"""agent tunnels: credentials reported through a tunnel, and which process holds each agent

Revision ID: 0004_agent_tunnels
Revises: 0003_cluster_permissions
Create Date: 2026-11-24 07:30:00

``cluster_credentials.via_tunnel`` says the apiserver is reached through the
cluster's kube-agent connection rather than directly; ``agent_placements`` records
which gateway process (``<instance>/<pid>``) holds that connection now.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004_agent_tunnels'
down_revision = '0003_cluster_permissions'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('cluster_credentials', schema=None) as batch_op:
        batch_op.add_column(sa.Column('via_tunnel', sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_table('agent_placements',
    sa.Column('cluster_id', sa.String(length=128), nullable=False),
    sa.Column('holder_id', sa.String(length=160), nullable=False),
    sa.Column('peer_address', sa.String(length=300), nullable=True),
    sa.Column('peer_fingerprint', sa.String(length=128), nullable=True),
    sa.Column('connected_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('seen_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['cluster_id'], ['clusters.id'], name=op.f('fk_agent_placements_cluster_id_clusters'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('cluster_id', name=op.f('pk_agent_placements'))
    )
    with op.batch_alter_table('agent_placements', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_agent_placements_holder_id'), ['holder_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('agent_placements', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_agent_placements_holder_id'))
    op.drop_table('agent_placements')
    with op.batch_alter_table('cluster_credentials', schema=None) as batch_op:
        batch_op.drop_column('via_tunnel')
