"""Listing and removing users and clusters, and the superuser flag.

* ``GET /rest/users/`` (superuser) — every user, by name.
* ``PUT /rest/users/{user_name}`` ``{"is_super_user": bool}`` (superuser) — promote or demote.
* ``DELETE /rest/users/{user_name}`` (superuser) — the user, their tokens (which stop
  authenticating) and their cluster permissions.
* ``GET /rest/clusters/`` — the clusters the caller holds ``view`` on (superusers: all),
  each with the caller's ``permission``.
* ``DELETE /rest/clusters/{cluster_id}`` (``edit``) — the cluster, its register token,
  reported credentials, permissions and Kubernetes admission configurations.

Rules that keep a gateway manageable: the last superuser can be neither demoted nor
deleted (409 ``LAST_SUPERUSER``), and nobody deletes themselves (409
``CANNOT_DELETE_SELF``: another superuser does it). A bootstrap user from
configuration comes back, as a superuser, at the next start. Changes reach requests
already authenticated within the token cache's ``ttl`` (5 s by default), like a
revoked token, and the tunnel within ``cluster_cache_ttl``.
"""

from __future__ import annotations

from werkzeug.wrappers import Response

from ...clusters.permissions import EDIT
from ...core.errors import Conflict
from ...core.schemas.validation import validate
from .calls import Ctx, json_response
from .endpoints import cluster_json, user_json


def list_users(ctx: Ctx) -> Response:
    ctx.require_superuser()
    return json_response([user_json(u) for u in ctx.store.list_users()])


def update_user(ctx: Ctx, user_name: str) -> Response:
    actor = ctx.require_superuser()
    body = ctx.body()
    validate("user_update", body)
    user, previous = ctx.store.set_superuser(user_name, body["is_super_user"])
    if previous != user.is_superuser:
        ctx.store.record_audit(
            actor.name, "user.update", f"user:{user.name}",
            {"user_id": user.id, "is_super_user": {"old": previous, "new": user.is_superuser}},
        )
    return json_response(user_json(user))


def delete_user(ctx: Ctx, user_name: str) -> Response:
    actor = ctx.require_superuser()
    if user_name == actor.name:
        raise Conflict("a user cannot delete themselves: another superuser can", code_name="CANNOT_DELETE_SELF")
    user, removed, tokens = ctx.store.delete_user(user_name)
    permissions = [{"cluster_id": c, "permission": p} for c, p in removed]
    ctx.store.record_audit(
        actor.name, "user.delete", f"user:{user.name}",
        {"user_id": user.id, "was_superuser": user.is_superuser, "tokens_revoked": tokens,
         "permissions_removed": permissions},
    )
    return json_response({**user_json(user), "tokens_revoked": tokens, "permissions_removed": permissions})


def list_clusters(ctx: Ctx) -> Response:
    user = ctx.require_user()
    return json_response([{**cluster_json(c), "permission": p} for c, p in ctx.access.visible(user)])


def delete_cluster(ctx: Ctx, cluster_id: str) -> Response:
    actor, cluster = ctx.require_cluster(cluster_id, EDIT)
    removed = ctx.store.delete_cluster(cluster.id)
    ctx.store.record_audit(actor.name, "cluster.delete", f"cluster:{cluster.id}",
                           {"project_id": cluster.project_id, "cluster_type": cluster.cluster_type, **removed})
    return json_response({**cluster_json(cluster), "deleted": removed})
