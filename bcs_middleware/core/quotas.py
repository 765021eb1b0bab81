"""Per-user quotas: how much of the gateway's records a user can give themselves.

Any user may hold things they made: clusters (and, hanging off each, a register
token, reported credentials, an agent placement), admission webhook configurations
of the clusters they manage, cluster permissions they grant, tokens a superuser
issues them. Each kind is bounded here; the store enforces the bound in the same
transaction as the insert, under a row lock of the user (or of the cluster), so
concurrent creates from several workers or gateway instances on one PostgreSQL
cannot pass it (:mod:`bcs_middleware.store.sql`).

=====================================  =======  ================================================
quota                                  default  what is counted
=====================================  =======  ================================================
``clusters_per_user``                  50       clusters the user created and that still exist
``tokens_per_user``                    20       the user's usable tokens (not revoked or expired)
``webhook_configurations_per_cluster`` 20       a cluster's Kubernetes admission configurations
                                                and its own bcs definitions, together
``permissions_per_cluster``            200      users holding a permission on one cluster
=====================================  =======  ================================================

What else a plain user can make is bounded by these: one register token, one set of
credentials and one agent placement per cluster; a bcs definition per (operation,
kind) — four at most — of a Mesos cluster; 64 webhooks per configuration (its schema).
The audit trail grows with actions, not with records: it is bounded by how often a
user may call the API, not by a quota.

Superusers are exempt from every quota: they are the operators who set them, and
their records (bootstrap tokens, gateway-wide definitions) are configuration. A
quota's limit is a non-negative number (``0``: none may be created) or ``unlimited``.

Over a quota the answer is ``403 QUOTA_EXCEEDED`` naming the quota, what is used and
the limit (as kube-apiserver answers a ResourceQuota: ``403 Forbidden: exceeded
quota``): retrying does not help, deleting something or a larger limit does. The
JSON error body carries ``quota`` and ``limit`` beside ``code_name`` and ``message``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from . import environ as env
from .errors import Forbidden

QuotaName = Literal[
    "clusters_per_user", "tokens_per_user", "webhook_configurations_per_cluster", "permissions_per_cluster"
]
_UNLIMITED = ("unlimited", "none")


@dataclass(frozen=True)
class Quotas:
    """The limits; ``None`` is unlimited. Defaults as documented in the module."""

    clusters_per_user: int | None = 50
    tokens_per_user: int | None = 20
    webhook_configurations_per_cluster: int | None = 20
    permissions_per_cluster: int | None = 200

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"quota {item.name}: must be a non-negative integer or unlimited, not {value!r}")

    def limit(self, name: QuotaName, actor: env.User | None) -> int | None:
        """The limit ``actor`` is held to for ``name``; ``None`` (unlimited) for superusers."""
        if actor is not None and actor.is_superuser:
            return None
        value: int | None = getattr(self, name)
        return value

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(item.name for item in fields(cls))


def limit_value(raw: str | int | None) -> int | None:
    """An ini value: a non-negative integer, or ``unlimited``."""
    if raw is None or isinstance(raw, int):
        return raw
    text = raw.strip().lower()
    if text in _UNLIMITED:
        return None
    try:
        number = int(text)
    except ValueError:
        raise ValueError(f"not a quota (a number, or unlimited): {raw!r}") from None
    if number < 0:
        raise ValueError(f"a quota cannot be negative: {raw!r}")
    return number


class QuotaExceeded(Forbidden):
    """Creating one more would pass a quota (nothing was created).

    :param quota: the quota's name (:class:`Quotas` field).
    :param limit: its limit.
    :param holder: whose quota, as the client knows it (``user 'bob'``, ``cluster 'c1'``).
    :param used: how many are counted now (more than ``limit`` after a limit was lowered).
    """

    code_name = "QUOTA_EXCEEDED"

    def __init__(self, quota: QuotaName, limit: int, holder: str, used: int) -> None:
        super().__init__(f"exceeded quota {quota} of {holder}: used {used}, limited: {limit} "
                         "(delete one first, or ask a superuser to raise the limit)")
        self.quota = quota
        self.limit = limit

    def body(self, style: env.ErrorStyle = "json") -> dict[str, Any]:
        body = super().body(style)
        if style == "json":
            body.update(quota=self.quota, limit=self.limit)
        return body
