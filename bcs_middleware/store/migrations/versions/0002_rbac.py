"""rbac: leader leases and reconciler status

Revision ID: 0002_rbac
Revises: 0001
Create Date: 2026-11-23 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002_rbac'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('leases',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('holder', sa.String(length=128), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('acquired_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_leases'))
    )
    op.create_table('rbac_status',
    sa.Column('scope', sa.String(length=160), nullable=False),
    sa.Column('document', sa.JSON(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('scope', name=op.f('pk_rbac_status'))
    )


def downgrade() -> None:
    op.drop_table('rbac_status')
    op.drop_table('leases')
