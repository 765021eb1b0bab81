"""Where the client finds its gateway, CA and token: flags, then environment, then the config file.

The config file (``$BCS_CONFIG``, else ``$XDG_CONFIG_HOME/bcs-middleware/config.json``,
else ``~/.config/bcs-middleware/config.json``) is written by ``login``, mode 0600: it
holds a token.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .rest import EXIT_USAGE, ClientError, Connection

ENV_SERVER = "BCS_SERVER"
ENV_CA_FILE = "BCS_CA_FILE"
ENV_TOKEN = "BCS_TOKEN"
ENV_CONFIG = "BCS_CONFIG"


def config_path() -> Path:
    if os.environ.get(ENV_CONFIG):
        return Path(os.environ[ENV_CONFIG])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "bcs-middleware" / "config.json"


def read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ClientError(f"cannot read {path}: {type(exc).__name__}", exit_code=EXIT_USAGE) from None
    return data if isinstance(data, dict) else {}


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with a file only this user can read."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:  # mkstemp creates it 0600
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_config(path: Path, *, server: str, token: str, ca_file: str | None, auth: str = "token") -> None:
    """``auth="oidc"``: no token is kept here; it is the identity-provider sign-in's (``login --issuer``)."""
    data = {"server": server, "ca_file": ca_file, "token": token, "auth": auth}
    write_private(path, json.dumps(data, indent=2) + "\n")


def resolve(server: str | None, ca_file: str | None, token: str | None, timeout: float,
            signed_in: Callable[[], str] | None = None) -> Connection:
    """The connection the flags, environment and config file describe (first found wins).

    :param signed_in: the current token of an identity-provider sign-in (``login --issuer``), asked
        when the saved gateway's config says it was signed in so.
    """
    saved = read_config(config_path())
    server = server or os.environ.get(ENV_SERVER)
    if not server or server.rstrip("/") == str(saved.get("server", "")).rstrip("/"):
        # The saved token and CA belong to the saved gateway: never sent to another one.
        server = server or saved.get("server")
        token = token or os.environ.get(ENV_TOKEN) or saved.get("token")
        if not token and saved.get("auth") == "oidc" and signed_in is not None:
            token = signed_in()
        ca_file = ca_file or os.environ.get(ENV_CA_FILE) or saved.get("ca_file")
    else:
        token = token or os.environ.get(ENV_TOKEN)
        ca_file = ca_file or os.environ.get(ENV_CA_FILE)
    if not server:
        raise ClientError(f"no gateway: pass --server, set {ENV_SERVER}, or run login", exit_code=EXIT_USAGE)
    if not token:
        raise ClientError(f"no token: pass --token, set {ENV_TOKEN}, or run login", exit_code=EXIT_USAGE)
    if not server.startswith("https://"):
        # A bearer token never travels in clear text from this client.
        raise ClientError(f"--server must be an https:// URL, not {server!r}", exit_code=EXIT_USAGE)
    if ca_file and not Path(ca_file).is_file():
        raise ClientError(f"--ca-file {ca_file}: no such file", exit_code=EXIT_USAGE)
    return Connection(server.rstrip("/"), token.strip(), str(Path(ca_file).absolute()) if ca_file else None, timeout)
