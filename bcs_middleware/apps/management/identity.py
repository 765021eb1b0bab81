"""Who the caller is (``GET /rest/whoami``) and the cluster permissions groups hold.

``/rest/clusters/{id}/group_permissions[/{group}]`` (``GET``, ``PUT``, ``DELETE``; the
cluster's ``edit`` holders) grant ``view`` or ``edit`` on a cluster to every member of a
group — the groups a user's authenticator maps (an identity provider's groups claim, a
tokens file's). A group name is at most 253 printable characters and never ``system:…``:
those are Kubernetes' own (``system:authenticated`` would be every user). The one exception is
``system:unauthenticated``, the group of the anonymous user (:mod:`bcs_middleware.authn.anonymous`):
a superuser may grant it ``view`` on a cluster (never ``edit``), so that requests without
credentials reach that cluster, where its RBAC decides what ``system:anonymous`` may do.
"""

from __future__ import annotations

from typing import Any

from werkzeug.wrappers import Response

from ...clusters.permissions import EDIT, VIEW
from ...core.environ import UNAUTHENTICATED, User
from ...core.errors import Forbidden, NotFound, ValidationError
from ...core.records import GroupPermissionRecord
from ...core.schemas.validation import validate
from .calls import Ctx, json_response

MAX_GROUP_NAME = 253


def whoami(ctx: Ctx) -> Response:
    """The caller as the gateway sees them: name, groups, how they signed in and until when."""
    user = ctx.require_user()
    return json_response({
        "user_name": user.name,
        "uid": user.uid,
        "groups": list(user.groups),
        "extra": {key: list(values) for key, values in user.extra},
        "is_superuser": user.is_superuser,
        "authenticated_by": user.authenticated_by,
        "expires_at": user.expires_at,
    })


def _group_json(record: GroupPermissionRecord) -> dict[str, Any]:
    return {"cluster_id": record.cluster_id, "group": record.group_name, "permission": record.permission,
            "updated_at": record.updated_at.isoformat().replace("+00:00", "Z")}


def _check_group(group: str, permission: str, actor: User) -> None:
    if not group or len(group) > MAX_GROUP_NAME or not group.isprintable():
        raise ValidationError(f"group: 1 to {MAX_GROUP_NAME} printable characters")
    if group == UNAUTHENTICATED:
        if permission != VIEW:
            raise ValidationError(f"group: {UNAUTHENTICATED} (requests without credentials) can hold view only")
        if not actor.is_superuser:
            raise Forbidden(f"only a superuser may open a cluster to {UNAUTHENTICATED}")
        return
    if group.startswith("system:"):
        raise ValidationError("group: system: groups are Kubernetes' own and cannot hold cluster permissions")


def _found(ctx: Ctx, cluster_id: str, group: str) -> GroupPermissionRecord:
    found = ctx.store.list_group_permissions(cluster_id, group)
    if not found:
        raise NotFound(f"group {group!r} has no permission on cluster {cluster_id!r}",
                       code_name="PERMISSION_NOT_FOUND")
    return found[0]


def list_group_permissions(ctx: Ctx, cluster_id: str) -> Response:
    _, cluster = ctx.require_cluster(cluster_id, EDIT)
    return json_response([_group_json(p) for p in ctx.store.list_group_permissions(cluster.id)])


def get_group_permission(ctx: Ctx, cluster_id: str, group: str) -> Response:
    _, cluster = ctx.require_cluster(cluster_id, EDIT)
    return json_response(_group_json(_found(ctx, cluster.id, group)))


def put_group_permission(ctx: Ctx, cluster_id: str, group: str) -> Response:
    actor, cluster = ctx.require_cluster(cluster_id, EDIT)
    body = ctx.body()
    validate("cluster_permission_put", body)
    _check_group(group, body["permission"], actor)
    previous = ctx.store.set_group_permission(
        cluster.id, group, body["permission"], limit=ctx.settings.quotas.limit("permissions_per_cluster", actor))
    ctx.store.record_audit(actor.name, "cluster_group_permission.put", f"cluster:{cluster.id}",
                           {"group": group, "old": previous, "new": body["permission"]})
    return json_response(_group_json(_found(ctx, cluster.id, group)), 200 if previous else 201)


def delete_group_permission(ctx: Ctx, cluster_id: str, group: str) -> Response:
    actor, cluster = ctx.require_cluster(cluster_id, EDIT)
    found = _found(ctx, cluster.id, group)
    previous = ctx.store.set_group_permission(cluster.id, group, None)
    ctx.store.record_audit(actor.name, "cluster_group_permission.delete", f"cluster:{cluster.id}",
                           {"group": group, "old": previous, "new": None})
    return json_response(_group_json(found))
