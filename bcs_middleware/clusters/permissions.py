"""Per-cluster permissions: who may use a cluster (``view``) and who may manage it (``edit``).

The vocabulary is the source system's ``user_cluster_permissions``:

* ``view`` — use the cluster: read it, get a kubeconfig or client credentials for it,
  send requests through the tunnel (where the cluster's own RBAC then decides, via
  impersonation, what the user may do inside it);
* ``edit`` — implies ``view``, and manage it: its register token (read, create,
  revoke), its credential status, its Kubernetes admission webhook configurations
  and its permissions;
* superusers have ``edit`` on every cluster.

The creator of a cluster gets ``edit``. A group may hold ``view`` or ``edit`` on a cluster
(``/rest/clusters/{id}/group_permissions/{group}``): every member holds it, the stronger
of a user's own and their groups' counting. With a permission subscription configured
(:mod:`bcs_middleware.rbac`), a user whom the subscription grants anything on a
cluster (by name, by one of their groups, or with cluster ``"*"``) has ``view`` on it.

A user without ``view`` gets the same 404 as for a cluster that does not exist —
everywhere, the tunnel included — so cluster ids do not leak; a user with ``view``
who tries to manage gets 403.

The tunnel asks through a :class:`~bcs_middleware.core.cache.Cache`: a granted or
revoked permission takes effect there within its ``ttl`` (the gateway's
``cluster_cache_ttl``, 5 s by default). The management API asks the store every time.

Who may register a cluster at all is :class:`ClusterCreators` (the gateway's
``cluster_creators``); whatever it says, a ``mesos`` cluster, or an id that a
mesos-driver already serves, is registered by superusers only
(:func:`reserved_cluster_id`) — a user must never gain a cluster whose drivers or
agents someone else runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..core import environ as env
from ..core.cache import Cache
from ..core.errors import Forbidden, NotFound
from ..core.records import ClusterRecord

VIEW = "view"
EDIT = "edit"
#: Every permission, weakest first.
PERMISSIONS = (VIEW, EDIT)
_RANK = {None: 0, VIEW: 1, EDIT: 2}


@dataclass(frozen=True)
class ClusterCreators:
    """Who may register a cluster (``POST /rest/clusters/bcs``); superusers always may.

    ``everyone`` (the default, as the source system let any user register: what a user
    can then make is bounded by :mod:`bcs_middleware.core.quotas`, and no id that drivers
    serve can be taken); ``superusers``; or a list of ``user:NAME`` and ``group:NAME``
    entries — the users named and the members of the groups named (a user's groups as
    their authenticator gives them: a tokens file, a client certificate mapping, an
    identity provider). Refusal is ``403 CLUSTER_CREATION_FORBIDDEN``.
    """

    everyone: bool = True
    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()

    def allows(self, user: env.User) -> bool:
        return (user.is_superuser or self.everyone or user.name in self.users
                or any(group in self.groups for group in user.groups))

    def describe(self) -> str:
        """What a refused user is told: who may, without naming anyone else."""
        if self.everyone:
            return "every user"
        return "named users and groups, and superusers" if self.users or self.groups else "superusers only"

    @classmethod
    def parse(cls, value: str) -> ClusterCreators:
        """``everyone`` | ``superusers`` | ``user:alice group:ops ...`` (spaces or commas)."""
        items = [item for item in value.replace(",", " ").split() if item]
        if items == ["everyone"]:
            return cls()
        if items == ["superusers"]:
            return cls(everyone=False)
        users, groups = set(), set()
        for item in items:
            kind, _, name = item.partition(":")
            if kind == "user" and name:
                users.add(name)
            elif kind == "group" and name:
                groups.add(name)
            else:
                raise ValueError(f"expected everyone, superusers, or user:NAME / group:NAME entries, not {item!r}")
        if not users and not groups:
            raise ValueError("expected everyone, superusers, or user:NAME / group:NAME entries")
        return cls(everyone=False, users=frozenset(users), groups=frozenset(groups))


class DriverDirectory(Protocol):
    """What :func:`reserved_cluster_id` asks of discovery (every ``Discovery`` has it)."""

    def registered(self, cluster_id: str) -> bool: ...

    def drivers(self, cluster_id: str) -> tuple[object, ...]: ...


def reserved_cluster_id(cluster_id: str, cluster_type: str, drivers: DriverDirectory | None) -> str | None:
    """Why only a superuser may register ``cluster_id`` as ``cluster_type``; ``None`` when anyone may.

    A ``mesos`` cluster is reached through drivers the operator runs, and an id that
    drivers already serve (found in ZooKeeper or configured statically) is theirs: a
    user registering it — as ``mesos`` or as ``k8s`` — would be handed the route to
    someone else's cluster. (The Mesos route also never sends a ``k8s`` record's id to
    drivers, so drivers that appear after a user registered the id are safe too.)
    """
    if cluster_type == "mesos":
        return "Mesos clusters are registered by superusers"
    if drivers is not None and (drivers.registered(cluster_id) or drivers.drivers(cluster_id)):
        return f"mesos-drivers serve cluster id {cluster_id!r}: only a superuser may register it"
    return None


def _stronger(a: str | None, b: str | None) -> str | None:
    return a if _RANK.get(a, 0) >= _RANK.get(b, 0) else b


def cluster_not_found(cluster_id: str) -> NotFound:
    """The one answer for a cluster that does not exist and for one the caller may not see."""
    return NotFound(f"cluster {cluster_id!r} not found", code_name="CLUSTER_NOT_FOUND")


class PermissionStore(Protocol):
    """What :class:`ClusterAuthorizer` reads (``SQLStore`` has it)."""

    def find_cluster(self, cluster_id: str) -> ClusterRecord | None: ...

    def cluster_permission(self, cluster_id: str, user_id: int) -> str | None: ...

    def group_cluster_permission(self, cluster_id: str, groups: tuple[str, ...]) -> str | None: ...

    def groups_cluster_permissions(self, groups: tuple[str, ...]) -> dict[str, str]: ...

    def rbac_grants_cluster(self, user_name: str, groups: tuple[str, ...], cluster_id: str) -> bool: ...

    def list_clusters(self) -> list[ClusterRecord]: ...

    def user_cluster_permissions(self, user_id: int) -> dict[str, str]: ...

    def rbac_granted_clusters(self, user_name: str, groups: tuple[str, ...]) -> set[str]: ...


class ClusterAccess(Protocol):
    """The question every part of the gateway asks before it touches a cluster for a user."""

    def allows(self, user: env.User, cluster_id: str, needed: str) -> bool: ...

    def require(self, user: env.User, cluster_id: str, needed: str) -> ClusterRecord: ...

    def visible(self, user: env.User) -> list[tuple[ClusterRecord, str]]: ...


class ClusterAuthorizer:
    """Decides a user's permission on a cluster (see the module docstring).

    :param store: the permission table and the subscription's grants.
    :param rbac_grants: honour the permission subscription's grants (``view``);
        on only when the gateway runs the subscription, so stale rows of a removed
        subscription grant nothing.
    :param ttl: cache answers this many seconds (the tunnel); ``0`` asks the store
        every time (the management API).
    """

    def __init__(self, store: PermissionStore, *, rbac_grants: bool = False, ttl: float = 0.0) -> None:
        self.store = store
        self.rbac_grants = rbac_grants
        self._cache: Cache[tuple[env.User, str], str | None] = Cache(max_entries=10_000, max_age=max(ttl, 0))

    def permission(self, user: env.User, cluster_id: str) -> str | None:
        """``"edit"``, ``"view"`` or ``None`` (the cluster's existence is not checked)."""
        if user.is_superuser:
            return EDIT
        return self._cache.load((user, cluster_id), self._load)

    def _load(self, key: tuple[env.User, str]) -> str | None:
        user, cluster_id = key
        # A user the store keeps no record of (an identity provider's) holds what their groups hold.
        own = self.store.cluster_permission(cluster_id, user.id) if user.id != env.NO_RECORD else None
        found = _stronger(own, self.store.group_cluster_permission(cluster_id, user.groups))
        if user.anonymous and found == EDIT:
            found = VIEW  # a request without credentials never manages a cluster, whatever a row says
        if found is None and self.rbac_grants and self.store.rbac_grants_cluster(
            user.name, user.kubernetes_groups, cluster_id
        ):
            # The groups are those the tunnel impersonates, so a grant means here
            # what it means to the cluster's RBAC.
            return VIEW
        return found if found in _RANK else None

    def visible(self, user: env.User) -> list[tuple[ClusterRecord, str]]:
        """Every cluster ``user`` holds ``view`` on, with their permission, by cluster id.

        The same rules as :meth:`permission`, answered for all clusters with a
        bounded number of queries (listing must not cost one query per cluster).
        """
        clusters = self.store.list_clusters()
        if user.is_superuser:
            return [(c, EDIT) for c in clusters]
        held = self.store.user_cluster_permissions(user.id) if user.id != env.NO_RECORD else {}
        for cluster_id, group_permission in self.store.groups_cluster_permissions(user.groups).items():
            held[cluster_id] = _stronger(held.get(cluster_id), group_permission) or group_permission
        granted: set[str] = set()
        if self.rbac_grants:
            granted = self.store.rbac_granted_clusters(user.name, user.kubernetes_groups)
        found: list[tuple[ClusterRecord, str]] = []
        for cluster in clusters:
            permission = held.get(cluster.id)
            if permission is None and ("*" in granted or cluster.id in granted):
                permission = VIEW
            if permission in (VIEW, EDIT):
                found.append((cluster, permission))
        return found

    def allows(self, user: env.User, cluster_id: str, needed: str) -> bool:
        return _RANK[self.permission(user, cluster_id)] >= _RANK[needed]

    def require(self, user: env.User, cluster_id: str, needed: str) -> ClusterRecord:
        """The cluster, if ``user`` holds ``needed`` on it.

        :raises NotFound: no such cluster, or the user may not even see it (same answer).
        :raises Forbidden: the user may see it but not manage it.
        """
        cluster = self.store.find_cluster(cluster_id)
        if cluster is None or not self.allows(user, cluster.id, VIEW):
            raise cluster_not_found(cluster_id)
        if not self.allows(user, cluster.id, needed):
            raise Forbidden(
                f"user {user.name!r} needs the {needed!r} permission on cluster {cluster.id!r}",
                code_name="CLUSTER_PERMISSION_REQUIRED",
            )
        return cluster
