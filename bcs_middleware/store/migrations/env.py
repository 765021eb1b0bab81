"""Alembic environment: runs on the connection the store hands over (see ``migrate.py``)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from bcs_middleware.store.models import metadata

config = context.config
connection = config.attributes.get("connection")

if connection is None:
    # Command-line use (``alembic -x url=...``), mostly for writing new revisions.
    url = context.get_x_argument(as_dictionary=True).get("url", "sqlite://")
    with create_engine(url).connect() as conn:
        context.configure(connection=conn, target_metadata=metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
