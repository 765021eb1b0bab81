"""The SQL store: SQLite by default, PostgreSQL or MySQL by URL.

The only module (with ``models`` and the migrations) that imports SQLAlchemy.
Uniqueness is left to the database's constraints, so two gateway processes
racing to create the same user or cluster get one success and one
:class:`~bcs_middleware.core.errors.Conflict` — never a duplicate, never a 500.

The connection, migrations and keys are the :class:`~.database.Database`'s (one per URL
per process, its engine remade after a fork), so a ``SQLStore`` may be built in the master
and used in every worker.
"""

from __future__ import annotations

from pathlib import Path

from .audit import AuditRepository
from .clusters import ClusterRepository
from .credentials import CredentialRepository
from .database import open_database
from .facts import FactRepository
from .permissions import PermissionRepository
from .placements import PlacementRepository
from .tokens import TokenRepository
from .users import UserRepository


class SQLStore(
    UserRepository,
    TokenRepository,
    ClusterRepository,
    CredentialRepository,
    PlacementRepository,
    PermissionRepository,
    FactRepository,
    AuditRepository,
):
    """Every repository over one database, for the callers that need many of them.

    A facade with no methods of its own: each method is its aggregate's repository's (users,
    tokens, clusters and register tokens, credentials, placements, permissions, instance facts,
    the audit trail); a caller that needs one aggregate can take that repository alone.

    :param db: the database (its engine, migrations and the key that encrypts secrets at rest).
    """


def open_store(
    url: str | None = None,
    *,
    data_dir: str | Path | None = None,
    secret_key: str | None = None,
    migrate: bool = True,
) -> SQLStore:
    """The store over the process's database for a URL (or SQLite in ``data_dir``) and key
    source (:func:`~.database.open_database`: every caller naming the same one shares it)."""
    return SQLStore(open_database(url, data_dir=data_dir, secret_key=secret_key, migrate=migrate))
