"""Permission data → the Kubernetes RBAC bindings each cluster should hold.

The data format (JSON or YAML; schema ``core/schemas/rbac_permissions.json``)::

    {"version": 1,
     "grants": [
       {"user": "alice", "cluster": "BCS-K8S-001", "namespace": "default", "role": "view"},
       {"group": "ops", "cluster": "*", "role": "edit"}
     ]}

* ``user`` or ``group`` (exactly one): the name the gateway impersonates —
  ``Impersonate-User`` is the gateway user's name, ``Impersonate-Group`` carries
  ``system:authenticated`` and the user's groups;
* ``cluster``: a cluster id, or ``*`` for every Kubernetes cluster in the store;
* ``namespace`` (optional): present → a ``RoleBinding`` in that namespace,
  absent → a ``ClusterRoleBinding``;
* ``role``: the ``ClusterRole`` bound — ``cluster-admin``, ``admin``, ``edit``,
  ``view`` or any named ClusterRole (a RoleBinding may reference a ClusterRole).

Binding names are deterministic — ``bcs:<user>:<role>`` for users and
``bcs:group:<group>:<role>`` for groups — so a run can tell what it wants from
what exists by name alone. A part that is not a plain lower-case name (or is
long) is sanitised and suffixed with a hash of the original, so two different
subjects never share a binding name. Every binding carries the label
``app.kubernetes.io/managed-by: bcs-middleware``; objects without it are never
touched.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from ..core.bodies import parse_yaml
from ..core.errors import BadRequest, ValidationError
from ..core.schemas.validation import validate

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "bcs-middleware"
#: ``labelSelector`` that lists exactly the objects this reconciler owns.
OWNED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
SUBJECT_ANNOTATION = "bcs-middleware/subject"
RBAC_GROUP = "rbac.authorization.k8s.io"
RBAC_API = f"{RBAC_GROUP}/v1"
#: Largest permission document accepted from any source.
MAX_DOCUMENT = 8 * 1024 * 1024

_PLAIN = re.compile(r"^[a-z0-9][a-z0-9._@-]{0,62}$")
_UNSAFE = re.compile(r"[^a-z0-9._@-]+")

BindingKind = Literal["ClusterRoleBinding", "RoleBinding"]


class PermissionsError(ValueError):
    """Permission data that cannot be used; the message says what is wrong, never quotes secrets."""


@dataclass(frozen=True)
class Grant:
    """One grant: ``subject_kind`` ``User`` or ``Group`` gets ``role`` on ``cluster`` (``*`` = all)."""

    subject_kind: Literal["User", "Group"]
    subject: str
    cluster: str
    role: str
    namespace: str | None = None

    def applies_to(self, cluster_id: str) -> bool:
        return self.cluster in ("*", cluster_id)


@dataclass(frozen=True)
class Permissions:
    """A validated permission document; ``digest`` identifies its content (not its formatting)."""

    grants: tuple[Grant, ...]
    digest: str
    version: int = 1


@dataclass(frozen=True)
class Binding:
    """A binding a cluster should hold (``body`` is the object to create or replace)."""

    kind: BindingKind
    name: str
    namespace: str | None
    body: dict[str, Any] = field(compare=False, hash=False)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.namespace or "", self.name)


def _name_part(value: str) -> str:
    if _PLAIN.match(value):
        return value
    cleaned = _UNSAFE.sub("-", value.lower()).strip("-.")[:40] or "x"
    return f"{cleaned}-{hashlib.sha256(value.encode()).hexdigest()[:8]}"


def binding_name(grant: Grant) -> str:
    """``bcs:<user>:<role>`` or ``bcs:group:<group>:<role>``, each part sanitised."""
    prefix = "bcs" if grant.subject_kind == "User" else "bcs:group"
    return f"{prefix}:{_name_part(grant.subject)}:{_name_part(grant.role)}"


def parse_permissions(document: Any) -> Permissions:
    """Validate a decoded document against the schema and build :class:`Permissions`.

    :raises PermissionsError: naming the offending field.
    """
    try:
        validate("rbac_permissions", document)
    except ValidationError as exc:
        raise PermissionsError(exc.message) from None
    grants: list[Grant] = []
    for item in document["grants"]:
        kind: Literal["User", "Group"] = "User" if "user" in item else "Group"
        grants.append(Grant(kind, item["user"] if kind == "User" else item["group"], item["cluster"],
                            item["role"], item.get("namespace")))
    unique = tuple(sorted(set(grants), key=lambda g: (g.cluster, g.namespace or "", g.subject_kind,
                                                      g.subject, g.role)))
    canonical = json.dumps([[g.subject_kind, g.subject, g.cluster, g.namespace, g.role] for g in unique])
    return Permissions(unique, hashlib.sha256(canonical.encode()).hexdigest(), document["version"])


def load_permissions(data: bytes) -> Permissions:
    """Decode JSON or YAML bytes (YAML is a superset of JSON) and validate them."""
    if len(data) > MAX_DOCUMENT:
        raise PermissionsError(f"permission data is larger than {MAX_DOCUMENT} bytes")
    try:
        document = parse_yaml(data, what="permission data")
    except BadRequest as exc:
        raise PermissionsError(exc.message) from None
    return parse_permissions(document)


def desired_bindings(permissions: Permissions, cluster_id: str) -> dict[tuple[str, str, str], Binding]:
    """Every binding ``cluster_id`` should hold, keyed by ``(kind, namespace, name)``."""
    wanted: dict[tuple[str, str, str], Binding] = {}
    for grant in permissions.grants:
        if not grant.applies_to(cluster_id):
            continue
        name = binding_name(grant)
        kind: BindingKind = "RoleBinding" if grant.namespace else "ClusterRoleBinding"
        metadata: dict[str, Any] = {
            "name": name,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "annotations": {SUBJECT_ANNOTATION: f"{grant.subject_kind}:{grant.subject}"},
        }
        if grant.namespace:
            metadata["namespace"] = grant.namespace
        body = {
            "apiVersion": RBAC_API,
            "kind": kind,
            "metadata": metadata,
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": grant.role},
            "subjects": [{"kind": grant.subject_kind, "apiGroup": RBAC_GROUP, "name": grant.subject}],
        }
        binding = Binding(kind, name, grant.namespace, body)
        wanted[binding.key] = binding
    return wanted


def is_owned(obj: dict[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(MANAGED_BY_LABEL) == MANAGED_BY)


def needs_update(existing: dict[str, Any], wanted: Binding) -> bool:
    """Subjects, roleRef, or our label/annotation drifted (someone edited the object)."""
    meta = existing.get("metadata") or {}
    want_meta = wanted.body["metadata"]
    return bool(
        existing.get("subjects") != wanted.body["subjects"]
        or existing.get("roleRef") != wanted.body["roleRef"]
        or (meta.get("labels") or {}).get(MANAGED_BY_LABEL) != MANAGED_BY
        or (meta.get("annotations") or {}).get(SUBJECT_ANNOTATION) != want_meta["annotations"][SUBJECT_ANNOTATION]
    )
