"""instance checks: what every gateway instance sharing the database must agree on

Revision ID: 0006_instance_checks
Revises: 0005_cluster_creators
Create Date: 2026-11-26 09:00:00

``instance_facts`` holds one row per fact, written by the first instance that starts
and checked by every later one (``bcs_middleware.compose.instance_checks``): a value encrypted
with the secret key (an instance whose key cannot decrypt it refuses to start) and the
CA the gateways hand to clients (an instance with another CA refuses to start).
Nothing in it is a secret: the check value decrypts to a fixed text, the CA is public.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006_instance_checks'
down_revision = '0005_cluster_creators'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('instance_facts',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('value', sa.Text(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_instance_facts'))
    )


def downgrade() -> None:
    op.drop_table('instance_facts')
