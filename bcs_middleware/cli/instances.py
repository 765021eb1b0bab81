"""``bcs-middleware rotate-admin-token`` and ``set-shared-ca``: deliberate changes to what the
gateway instances sharing a database agree on.

A gateway never changes these as a side effect of starting (``instance_checks``,
``bootstrap.apply_bootstrap``): an instance started with another admin token or another
CA than the database records refuses to start. These commands are the way to change
them on purpose; each says what the other instances then need.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import ConfigError
from ..serving.datadir import ADMIN_TOKEN_ENV, ADMIN_TOKEN_FILE, DEFAULT_DATA_DIR, announce_generated_admin_token

if TYPE_CHECKING:
    from ..store.sql import SQLStore

ROTATE_DESCRIPTION = (
    "Give a bootstrap superuser (default: admin) a new token in the gateway's database, and revoke the "
    "old one on every instance sharing it (within the 5 s token cache). The new token is BCS_ADMIN_TOKEN "
    "when it is set, else a new one written to DATA_DIR/admin.token (0600, shown once on a terminal). "
    "Run it where one instance runs; then give the new token to every other instance configured with "
    "the old one (those without a token of their own need nothing): started with the old token, an "
    "instance refuses to start."
)
CA_DESCRIPTION = (
    "Record the CA certificate(s) every gateway instance sharing the database hands to clients "
    "(client_credentials, kubeconfigs); an instance handing out another refuses to start. For a "
    "deliberate change of CA: record the new CA (or a bundle of the old and the new while clients move), "
    "then restart every instance with it."
)


def _database_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                        help=f"the gateway's data directory (default ./{DEFAULT_DATA_DIR})")
    parser.add_argument("--database-url", metavar="URL",
                        help="the gateways' database, when it is not SQLite in the data directory")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rotate = sub.add_parser("rotate-admin-token", help="give a bootstrap superuser a new token on every instance",
                            description=ROTATE_DESCRIPTION)
    _database_args(rotate)
    rotate.add_argument("--user", default="admin", help="the bootstrap user (default admin)")
    rotate.set_defaults(func=run_rotate)
    ca = sub.add_parser("set-shared-ca", help="record the CA every gateway instance hands to clients",
                        description=CA_DESCRIPTION)
    _database_args(ca)
    ca.add_argument("--ca-file", help="the CA certificate file, PEM; several certificates are a bundle "
                                      "(default DATA_DIR/tls/ca.crt)")
    ca.set_defaults(func=run_set_ca)


def _open_store(args: argparse.Namespace) -> SQLStore:
    from ..store.crypto import SecretBox
    from ..store.database import Database, sqlite_url
    from ..store.sql import SQLStore

    data_dir = Path(args.data_dir).absolute()
    if not args.database_url and not (data_dir / "bcs.sqlite3").exists():
        raise ConfigError(f"no gateway database in {data_dir} (give --data-dir, or --database-url)")
    # Neither command reads a secret back: no key is loaded (nor generated).
    store = SQLStore(Database(args.database_url or sqlite_url(data_dir), secrets=SecretBox([])))
    store.db.migrate()
    return store


def run_rotate(args: argparse.Namespace) -> int:
    from ..store.crypto import new_token, token_digest

    data_dir = Path(args.data_dir).absolute()
    store = _open_store(args)
    configured = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
    token = configured or new_token()
    staged = None
    try:
        if not configured:
            # Staged beside the file and put in place once the database has it: a failure on
            # either side never leaves a file with a token the database does not know.
            fd, name = tempfile.mkstemp(dir=data_dir, prefix=f".{ADMIN_TOKEN_FILE}.", suffix=".new")
            staged = Path(name)
            with os.fdopen(fd, "w") as fh:
                fh.write(token + "\n")
        user = store.ensure_user(args.user, is_superuser=True)
        store.claim_bootstrap_token(user.id, token_digest(token), mode="replace")
        store.record_audit("rotate-admin-token", "user.bootstrap_token.rotate", f"user:{args.user}")
        if staged is not None:
            path = data_dir / ADMIN_TOKEN_FILE
            os.replace(staged, path)
            staged = None
            announce_generated_admin_token(path, token)
    except OSError as exc:
        raise ConfigError(f"cannot write the new token into {data_dir}: {exc.strerror or exc}") from None
    finally:
        if staged is not None:
            staged.unlink(missing_ok=True)
        store.db.dispose()
    source = f"env {ADMIN_TOKEN_ENV}" if configured else str(data_dir / ADMIN_TOKEN_FILE)
    print(f"Bootstrap user {args.user!r} has a new token ({source}); the old one no longer works. Give it "
          f"to every instance configured with the old token ({ADMIN_TOKEN_ENV} or its DATA_DIR/{ADMIN_TOKEN_FILE}) "
          "before it restarts.", file=sys.stderr)
    return 0


def run_set_ca(args: argparse.Namespace) -> int:
    from ..compose.instance_checks import record_gateway_ca

    path = Path(args.ca_file) if args.ca_file else Path(args.data_dir).absolute() / "tls" / "ca.crt"
    try:
        pem = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--ca-file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    store = _open_store(args)
    try:
        before, now = record_gateway_ca(store, pem)
        store.record_audit("set-shared-ca", "gateway.ca.set", "gateway_ca", {"ca": now, "before": before})
    finally:
        store.db.dispose()
    print(f"Recorded the gateways' CA: {now}" + (f" (was {before})" if before and before != now else "")
          + ". Restart every instance with this CA; one handing out another refuses to start.", file=sys.stderr)
    return 0
