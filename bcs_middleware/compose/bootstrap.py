"""Bootstrap users: superusers from configuration, and how a start makes them real in the database.

A gateway's bootstrap users are parsed from the configuration (:func:`parse_bootstrap_users`:
token values come from the environment or a file, never from an ini file) and applied to the
database when the gateway opens its resources (:func:`apply_bootstrap`, called by
:func:`bcs_middleware.compose.resources.open_resources`) — once in the server's master to
stop a bad start with one clear message, and again in each worker (the claim is idempotent).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import ConfigError
from ..store.crypto import new_token, token_digest
from ..store.sql import SQLStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BootstrapUser:
    """A superuser from configuration; only the token's digest is kept.

    :param token_digest: the configured token's SHA-256 (``None``: no token is configured).
    :param generate_into: without a token, the file in the data directory where this
        instance writes a new one — only when the database holds none for the user yet.
    :param source: where the token comes from, for messages (never the token).
    """

    name: str
    token_digest: str | None = field(default=None, repr=False)
    generate_into: Path | None = None
    source: str = ""


def parse_bootstrap_users(spec: Mapping[str, str], base: Path | None = None) -> list[BootstrapUser]:
    """``name = env:VAR`` | ``file:/path`` | ``sha256:HEX`` → bootstrap users.

    Token values never sit in an ini file: they come from the environment or a
    file (mode 0600), or only their digest is written. Several sources separated
    by spaces are alternatives, the first available wins — ``env:BCS_ADMIN_TOKEN
    file:admin.token`` is what ``serve`` does. A relative ``file:`` is in ``base``
    (the data directory); when it is the last choice and does not exist, the user has
    no token here and one is generated into it if the database has none
    (:func:`apply_bootstrap`).
    """
    users = []
    for name, source in spec.items():
        choices = source.split()
        user = None
        for choice in choices:
            user = _bootstrap_source(name, choice, base, last=choice is choices[-1])
            if user is not None:
                break
        if user is None:
            raise ConfigError(f"bootstrap user {name!r}: expected env:VAR, file:/path or sha256:HEX")
        users.append(user)
    return users


def _bootstrap_source(name: str, source: str, base: Path | None, *, last: bool,
                      what: str = "bootstrap user") -> BootstrapUser | None:
    """The user from one source; ``None`` when it is absent and another may follow."""
    kind, _, value = source.partition(":")
    if kind == "env":
        token = os.environ.get(value, "").strip()
        if token:
            return BootstrapUser(name, token_digest(token), source=f"env {value}")
        if last:
            raise ConfigError(f"{what} {name!r}: environment variable {value} is not set")
        return None
    if kind == "file":
        path = Path(value)
        in_data_dir = not path.is_absolute() and base is not None
        if in_data_dir:
            path = base / path  # type: ignore[operator]
        if not path.exists():
            if not last:
                return None
            if in_data_dir:
                return BootstrapUser(name, generate_into=path, source=str(path))
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{what} {name!r}: cannot read {path}: {exc.strerror}") from None
        if not token:
            raise ConfigError(f"{what} {name!r}: {path} is empty")
        return BootstrapUser(name, token_digest(token), source=str(path))
    if kind == "sha256" and len(value) == 64:
        return BootstrapUser(name, value.lower(), source="a sha256 digest in the configuration")
    raise ConfigError(f"bootstrap user {name!r}: expected env:VAR, file:/path or sha256:HEX")


ROTATE_HINT = "bcs-middleware rotate-admin-token"
_REFUSED = {
    "conflict": "the database {db} already has another bootstrap token for this user (set by another gateway "
                "instance, or by an earlier configuration of this one), and this instance would lock out whoever "
                "holds it. Give this instance that token ({source}), or rotate it deliberately: {hint} "
                "(the old token then stops working on every instance)",
    "revoked": "the configured token ({source}) was revoked (rotated, or revoked through the API) and a restart "
               "does not bring it back: configure the current token, or set a new one: {hint}",
    "taken": "the configured token ({source}) is already another user's token: give this user a token of its own",
}
# Bootstrap users this process already said it joined (workers inherit the master's).
_joined: set[str] = set()


def apply_bootstrap(store: SQLStore, users: Iterable[BootstrapUser]) -> None:
    """Make each bootstrap user a superuser holding its configured token — never at the
    expense of another instance sharing the database.

    * A configured token the database holds already, or the first one for the user, is
      the user's bootstrap token; **another** usable one in the database refuses the start
      (a :class:`ConfigError` naming the fix): instances sharing a database bring the same
      token, and changing it is a deliberate rotation (``bcs-middleware rotate-admin-token``),
      not a side effect of a start. A token once revoked is never brought back by a start.
    * Without a configured token (``generate_into``), a user the database already holds a
      token for is **joined** as it is; only a user without one gets a new token, written
      0600 into the data directory and announced once.
    """
    for user in users:
        record = store.ensure_user(user.name, is_superuser=True)
        digest, mode, written = user.token_digest, "configured", None
        if digest is None and user.generate_into is not None:
            if store.has_bootstrap_token(user.name):
                _say_joined(user.name)
                continue
            digest, mode, written = _generate_token(user.generate_into)
        if digest is None:
            raise ConfigError(f"bootstrap user {user.name!r} has no token")
        outcome = store.claim_bootstrap_token(record.id, digest, mode=mode)  # type: ignore[arg-type]
        if outcome == "joined":  # another instance generated one first
            if written is not None:
                written[0].unlink(missing_ok=True)
            _say_joined(user.name)
        elif outcome in _REFUSED:
            raise ConfigError(f"bootstrap user {user.name!r}: " + _REFUSED[outcome].format(
                db=store.db.display_url, source=user.source, hint=ROTATE_HINT))
        elif written is not None:
            from ..serving.datadir import announce_generated_admin_token

            announce_generated_admin_token(*written)


def _generate_token(path: Path) -> tuple[str, str, tuple[Path, str] | None]:
    """A new token written into ``path``: its digest, the claim mode, and what was written.

    Another process of this server may write it first: then its token is the one."""
    from ..serving.datadir import write_secret_file

    token = new_token()
    try:
        write_secret_file(path, token)
    except FileExistsError:
        return token_digest(path.read_text().strip()), "configured", None
    except OSError as exc:
        raise ConfigError(f"cannot write the bootstrap token to {path}: {exc.strerror}") from None
    return token_digest(token), "generated", (path, token)


def _say_joined(name: str) -> None:
    if name not in _joined:
        _joined.add(name)
        log.info("bootstrap user %r: no token is configured on this instance and the database holds one "
                 "(made by another instance); using that. To replace it: %s", name, ROTATE_HINT)



def scraper_token_digest(source: str, data_dir: Path | None) -> str:
    """The digest of the Prometheus scraper's token ``source`` names (``env:``, ``file:`` or ``sha256:``)."""
    found = _bootstrap_source("metrics_token", source, data_dir, last=True, what="the scraper token")
    if found is None or found.token_digest is None:
        raise ConfigError(f"the scraper token 'metrics_token': cannot read {source.partition(':')[2]}")
    return found.token_digest
