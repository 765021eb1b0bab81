"""Merge the gateway's per-cluster kubeconfigs into the user's kubeconfig file.

Entries are replaced by name (``bcs-<cluster>`` clusters and contexts, the gateway's
user entries); every other cluster, user and context is kept as it was. The
current context is set only when the file has none. The file is written
atomically, mode 0600: it holds tokens.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import yaml

from .rest import ClientError
from .settings import write_private


def default_path() -> Path:
    """``$KUBECONFIG``'s first file (as kubectl writes to it), else ``~/.kube/config``."""
    env = os.environ.get("KUBECONFIG", "")
    first = next((p for p in env.split(os.pathsep) if p), None)
    return Path(first) if first else Path.home() / ".kube" / "config"


def load(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {"apiVersion": "v1", "kind": "Config", "preferences": {}}
    try:
        document = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        raise ClientError(f"{path} is not a valid kubeconfig (YAML error); not touching it") from None
    if not isinstance(document, dict):
        raise ClientError(f"{path} is not a kubeconfig; not touching it")
    return document


def add_ca(fragment: dict[str, Any], ca_pem: bytes) -> None:
    """Give clusters the gateway CA the client trusts when the gateway named none.

    A gateway run from an ini file without ``gateway_ca_file`` hands out kubeconfigs
    without a CA; kubectl would then fail verification where this client succeeded.
    """
    for entry in fragment.get("clusters") or []:
        cluster = entry.get("cluster") or {}
        if not cluster.get("certificate-authority-data") and not cluster.get("certificate-authority"):
            cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()


def merge(document: dict[str, Any], fragment: dict[str, Any]) -> list[str]:
    """Put ``fragment``'s clusters, users and contexts into ``document``; the context names."""
    for section in ("clusters", "users", "contexts"):
        entries = [e for e in document.get(section) or [] if isinstance(e, dict)]
        for entry in fragment.get(section) or []:
            entries = [e for e in entries if e.get("name") != entry["name"]]
            entries.append(entry)
        document[section] = sorted(entries, key=lambda e: str(e.get("name")))
    names = [c["name"] for c in fragment.get("contexts") or []]
    if names and not document.get("current-context"):
        document["current-context"] = names[0]
    return names


def save(path: Path, document: dict[str, Any]) -> None:
    document.setdefault("apiVersion", "v1")
    document.setdefault("kind", "Config")
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    write_private(path, yaml.safe_dump(document, sort_keys=False))


def remove_user(document: dict[str, Any], user: str) -> list[str]:
    """Remove the user entry ``user`` and every context using it (and their clusters); the contexts removed."""
    contexts = [c for c in document.get("contexts") or [] if isinstance(c, dict)]
    gone = [c for c in contexts if (c.get("context") or {}).get("user") == user]
    names = [str(c.get("name")) for c in gone]
    clusters = {(c.get("context") or {}).get("cluster") for c in gone}
    document["contexts"] = [c for c in contexts if c not in gone]
    still_used = {(c.get("context") or {}).get("cluster") for c in document["contexts"]}
    document["clusters"] = [c for c in document.get("clusters") or []
                            if not isinstance(c, dict) or c.get("name") not in clusters - still_used]
    document["users"] = [u for u in document.get("users") or [] if not isinstance(u, dict) or u.get("name") != user]
    if document.get("current-context") in names:
        document["current-context"] = ""
    return names
