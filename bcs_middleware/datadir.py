"""The one data directory every way of running the gateway shares.

``bcs-middleware serve``, ``serve --config examples/gateway.ini`` and ``gunicorn
--paste examples/gateway.ini -c examples/gunicorn.conf.py`` all keep their state in
one directory (``./bcs-data`` unless told otherwise):

* ``bcs.sqlite3`` the store, ``secret.key`` its Fernet key (0600);
* ``admin.token`` the bootstrap admin's token (0600), unless ``BCS_ADMIN_TOKEN`` is set;
* ``tls/`` the generated CA and the HTTPS certificate it signed.

These run in the master process, before workers fork, so that a token is generated
once and announced once.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .store.crypto import new_token

DEFAULT_DATA_DIR = "bcs-data"
ADMIN_TOKEN_FILE = "admin.token"
ADMIN_TOKEN_ENV = "BCS_ADMIN_TOKEN"
# The bootstrap_users source every entry point uses (gateway.parse_bootstrap_users).
ADMIN_TOKEN_SOURCE = f"env:{ADMIN_TOKEN_ENV} file:{ADMIN_TOKEN_FILE}"


def _write_secret_file(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")


def admin_token_source(data_dir: Path) -> tuple[str, str | None]:
    """Where the bootstrap admin's token comes from, and a value to print once (new only)."""
    if os.environ.get(ADMIN_TOKEN_ENV, "").strip():
        return f"env:{ADMIN_TOKEN_ENV}", None
    path = data_dir / ADMIN_TOKEN_FILE
    if path.exists():
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)  # left readable to others by hand or by a restored backup
        return f"file:{path}", None
    token = new_token()
    _write_secret_file(path, token)
    return f"file:{path}", token


def announce_admin_token(data_dir: Path, token_source: str, new_token_value: str | None) -> None:
    """Tell the operator where the admin token is; its value only to a terminal, once."""
    # The value goes to a person at a terminal, never to stdout (the access log's stream,
    # usually collected): piped or under a supervisor, only the file is named.
    path = data_dir / ADMIN_TOKEN_FILE
    if new_token_value and sys.stderr.isatty():
        print(
            "\n  Generated the bootstrap admin token (shown only this once; also in "
            f"{path}, mode 0600):\n\n    {new_token_value}\n",
            file=sys.stderr, flush=True,
        )
    elif new_token_value:
        print(f"Generated the bootstrap admin token in {path} (mode 0600)", flush=True)
    elif token_source.startswith("file:"):
        print(f"Admin token: {path}", flush=True)


def prepare(data_dir: str | Path) -> Path:
    """Create the data directory (0700) and return its absolute path."""
    path = Path(data_dir).absolute()
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path
