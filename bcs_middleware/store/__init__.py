"""The store: SQLAlchemy-backed records (SQLite default, PostgreSQL/MySQL by URL)."""

from __future__ import annotations

from pathlib import Path

from .crypto import SecretBox, load_key_source
from .records import (
    AuditRecord,
    ClusterRecord,
    CredentialRecord,
    Holder,
    PermissionRecord,
    PlacementRecord,
    TokenRecord,
    UserRecord,
)
from .sql import SQLStore, normalize_url, sqlite_url

__all__ = [
    "AuditRecord",
    "ClusterRecord",
    "CredentialRecord",
    "Holder",
    "PermissionRecord",
    "PlacementRecord",
    "SQLStore",
    "SecretBox",
    "TokenRecord",
    "UserRecord",
    "normalize_url",
    "open_store",
    "sqlite_url",
]


def open_store(
    url: str | None = None,
    *,
    data_dir: str | Path | None = None,
    secret_key: str | None = None,
    migrate: bool = True,
) -> SQLStore:
    """The one way to get a store: URL (or SQLite in ``data_dir``), keys, migrations."""
    data_path = Path(data_dir) if data_dir is not None else None
    if url is None:
        if data_path is None:
            raise ValueError("open_store needs a database URL or a data directory")
        data_path.mkdir(parents=True, exist_ok=True)
        url = sqlite_url(data_path)
    keys, origin = load_key_source(secret_key, data_path)
    store = SQLStore(url, secrets=SecretBox(keys, origin=origin))
    if migrate:
        store.migrate()
    return store
