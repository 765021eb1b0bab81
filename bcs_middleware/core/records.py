"""Values the store hands out: frozen, and free of secrets unless the name says so."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class UserRecord:
    id: int
    name: str
    is_superuser: bool
    created_at: datetime


@dataclass(frozen=True)
class TokenRecord:
    """A user token's metadata; the value itself is never stored, only its hash."""

    id: int
    user_id: int
    token_type: str
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None
    revoked_at: datetime | None

    def usable(self, now: datetime) -> bool:
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > now


@dataclass(frozen=True)
class ClusterRecord:
    id: str
    project_id: str
    cluster_type: str
    created_at: datetime


@dataclass(frozen=True)
class GroupPermissionRecord:
    """A group's permission on a cluster: every member holds it."""

    cluster_id: str
    group_name: str
    permission: str
    updated_at: datetime


@dataclass(frozen=True)
class PermissionRecord:
    """A user's permission on a cluster: ``"view"`` (use it) or ``"edit"`` (also manage it)."""

    cluster_id: str
    user_id: int
    user_name: str
    permission: str
    updated_at: datetime


@dataclass(frozen=True)
class CredentialRecord:
    """What a cluster's kube-agent reported. ``user_token`` is a secret: never log it."""

    cluster_id: str
    server_addresses: tuple[str, ...]
    cacert_pem: str
    user_token: str = field(repr=False)
    updated_at: datetime | None = None
    #: reported through the kube-agent's tunnel: the apiserver is reached through it.
    via_tunnel: bool = False


@dataclass(frozen=True)
class Holder:
    """Who holds an agent tunnel: ``id`` is ``"<instance>/<pid>"``.

    ``peer_address``/``peer_fingerprint``: where other processes reach this one to
    forward a request to its agent (filled in by the peer listener, if any).
    Re-exported by :mod:`bcs_middleware.agent_tunnel.registry`.
    """

    id: str
    peer_address: str | None = None
    peer_fingerprint: str | None = None


@dataclass(frozen=True)
class PlacementRecord:
    """Which gateway process holds a cluster's agent tunnel (``holder_id`` = ``<instance>/<pid>``)."""

    cluster_id: str
    holder_id: str
    peer_address: str | None
    peer_fingerprint: str | None
    connected_at: datetime
    seen_at: datetime


@dataclass(frozen=True)
class AuditRecord:
    id: int
    at: datetime
    actor: str
    action: str
    target: str
    detail: dict[str, Any]
