"""The RBAC reconciler's tables; ``store/migrations/versions/0002_rbac.py`` creates them.

Defined on the store's ``metadata`` so naming conventions match; importing this
module is what registers them (the store itself never needs them).
"""

from __future__ import annotations

from sqlalchemy import JSON, Column, DateTime, String, Table

from ..store.models import metadata

# One row per lock name ("rbac"): who holds it and until when. A holder renews
# before expiry; anyone may take it over once it has expired.
leases = Table(
    "leases",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("holder", String(128), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("acquired_at", DateTime(timezone=True), nullable=False),
)

# What the reconciler last did, readable by every gateway process for
# GET /rest/rbac/status: "source" and "cluster:<id>" rows, a JSON document each.
rbac_status = Table(
    "rbac_status",
    metadata,
    Column("scope", String(160), primary_key=True),
    Column("document", JSON, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
