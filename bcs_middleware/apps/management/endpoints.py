"""Management REST API endpoints: one function each, ``(ctx, **url_values) -> Response``.

Routes, bodies and status codes follow the source system's bcs-api, fixed where
it was wrong (validation errors now get a real 400 instead of HTTP 200).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import yaml
from cryptography import x509
from werkzeug.wrappers import Response

from ...agent_tunnel.registry import PLACEMENT_STALE_AFTER
from ...clusters.permissions import EDIT, VIEW, reserved_cluster_id
from ...core import environ as env
from ...core.errors import BadRequest, Forbidden, NotFound, Unauthorized, ValidationError
from ...core.records import ClusterRecord, PermissionRecord, PlacementRecord, TokenRecord, UserRecord
from ...core.schemas.validation import validate
from ...layers.auth import bearer_token
from .calls import Ctx, json_response


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z") if value else None


def user_json(user: UserRecord) -> dict[str, Any]:
    return {
        "id": user.id,
        "name": user.name,
        "is_super_user": user.is_superuser,
        "created_at": _iso(user.created_at),
    }


def _token_json(token: TokenRecord) -> dict[str, Any]:
    return {
        "id": token.id,
        "user_id": token.user_id,
        "type": token.token_type,
        "created_at": _iso(token.created_at),
        "expires_at": _iso(token.expires_at),
        "last_used_at": _iso(token.last_used_at),
        "revoked_at": _iso(token.revoked_at),
    }


def cluster_json(cluster: ClusterRecord) -> dict[str, Any]:
    return {
        "id": cluster.id,
        "project_id": cluster.project_id,
        "cluster_type": cluster.cluster_type,
        "created_at": _iso(cluster.created_at),
    }


# -- users and tokens (superuser) ------------------------------------------------------


def create_user(ctx: Ctx) -> Response:
    actor = ctx.require_superuser()
    body = ctx.body()
    validate("user_create", body)
    user = ctx.store.create_user(body["user_name"])
    ctx.store.record_audit(actor.name, "user.create", f"user:{user.name}", {"user_id": user.id})
    return json_response(user_json(user), 201)


def get_user(ctx: Ctx, user_name: str) -> Response:
    ctx.require_superuser()
    user = ctx.store.find_user(user_name)
    if user is None:
        raise NotFound(f"user {user_name!r} not found", code_name="USER_NOT_FOUND")
    return json_response(user_json(user))


def create_token(ctx: Ctx, user_id: int) -> Response:
    actor = ctx.require_superuser()
    body = ctx.body(allow_empty=True)
    validate("token_create", body)
    expires_at = None
    if "expires_in" in body:
        expires_at = datetime.now(UTC) + timedelta(seconds=body["expires_in"])
    # The quota bounds the tokens a user holds, whoever issues them (superusers hold any number).
    token, value = ctx.store.create_token(
        user_id, token_type=body.get("token_type", "user"), expires_at=expires_at,
        limit=ctx.settings.quotas.tokens_per_user,
    )
    ctx.store.record_audit(actor.name, "token.create", f"user:{user_id}", {"token_id": token.id})
    # The only time the value is ever shown.
    return json_response({**_token_json(token), "user_token": value}, 201)


def list_tokens(ctx: Ctx, user_id: int) -> Response:
    ctx.require_superuser()
    return json_response([_token_json(t) for t in ctx.store.list_tokens(user_id)])


def revoke_token(ctx: Ctx, user_id: int, token_id: int) -> Response:
    actor = ctx.require_superuser()
    token = ctx.store.revoke_token(user_id, token_id)
    ctx.store.record_audit(actor.name, "token.revoke", f"user:{user_id}", {"token_id": token_id})
    return json_response(_token_json(token))


# -- clusters (who creates: cluster_creators; view to read, edit to manage: see clusters/permissions.py)


def create_cluster(ctx: Ctx) -> Response:
    actor = ctx.require_user()
    creators = ctx.settings.cluster_creators
    if not creators.allows(actor):
        raise Forbidden(f"user {actor.name!r} may not register clusters: this gateway lets {creators.describe()} "
                        "register them (ask a superuser to register it and grant you edit)",
                        code_name="CLUSTER_CREATION_FORBIDDEN")
    if actor.id == env.NO_RECORD and not actor.is_superuser:
        # The creator's edit is a row of the user's; a user signed in through an identity provider
        # has none, and gets cluster permissions through their groups instead.
        raise Forbidden(f"user {actor.name!r} signed in through an identity provider and may not register "
                        "clusters: a superuser registers it and grants edit to one of your groups",
                        code_name="CLUSTER_CREATION_FORBIDDEN")
    body = ctx.body()
    validate("cluster_create", body)
    if not actor.is_superuser:
        reserved = reserved_cluster_id(body["id"], body["cluster_type"], ctx.drivers)
        if reserved:
            raise Forbidden(reserved, code_name="CLUSTER_ID_RESERVED")
    cluster = ctx.store.create_cluster(
        body["id"], project_id=body["project_id"], cluster_type=body["cluster_type"],
        creator_id=None if actor.id == env.NO_RECORD else actor.id,
        limit=ctx.settings.quotas.limit("clusters_per_user", actor),
    )
    ctx.store.record_audit(
        actor.name, "cluster.create", f"cluster:{cluster.id}",
        {"project_id": cluster.project_id, "cluster_type": cluster.cluster_type},
    )
    return json_response(cluster_json(cluster), 201)


def get_cluster(ctx: Ctx, cluster_id: str) -> Response:
    _, cluster = ctx.require_cluster(cluster_id, VIEW)
    return json_response({**cluster_json(cluster), "agent": agent_json(ctx.store.get_placement(cluster.id))})


def agent_json(placement: PlacementRecord | None) -> dict[str, Any]:
    """Whether the cluster's kube-agent tunnel is connected (to any gateway process), and since when.

    A placement whose holder stopped writing its heartbeat (a process killed before it
    could clear it) reads as not connected.
    """
    now = datetime.now(UTC)
    live = placement is not None and now - placement.seen_at <= timedelta(seconds=PLACEMENT_STALE_AFTER)
    return {
        "tunnel_connected": live,
        "connected_since": _iso(placement.connected_at) if placement is not None and live else None,
        "last_seen_at": _iso(placement.seen_at) if placement is not None else None,
    }


def create_register_token(ctx: Ctx, cluster_id: str) -> Response:
    # One token per cluster: a second POST is a 409, never a silent rotation that
    # would cut off the running kube-agent. Rotate with DELETE, then POST.
    actor, cluster = ctx.require_cluster(cluster_id, EDIT)
    value = ctx.store.create_register_token(cluster.id)
    ctx.store.record_audit(actor.name, "register_token.create", f"cluster:{cluster.id}")
    return json_response({"cluster_id": cluster.id, "token": value}, 201)


def get_register_token(ctx: Ctx, cluster_id: str) -> Response:
    _, cluster = ctx.require_cluster(cluster_id, EDIT)
    value, created_at = ctx.store.get_register_token(cluster.id)
    return json_response({"cluster_id": cluster.id, "token": value, "created_at": _iso(created_at)})


def revoke_register_token(ctx: Ctx, cluster_id: str) -> Response:
    actor, cluster = ctx.require_cluster(cluster_id, EDIT)
    created_at = ctx.store.revoke_register_token(cluster.id)
    ctx.store.record_audit(
        actor.name, "register_token.revoke", f"cluster:{cluster.id}", {"created_at": _iso(created_at)}
    )
    return json_response({"cluster_id": cluster.id, "revoked": True, "created_at": _iso(created_at)})


def credential_status(ctx: Ctx, cluster_id: str) -> Response:
    """What the kube-agent last reported, without its secrets."""
    _, cluster = ctx.require_cluster(cluster_id, EDIT)
    creds = ctx.store.get_credentials(cluster.id)
    return json_response(
        {
            "cluster_id": cluster.id,
            "reported": creds is not None,
            "server_addresses": list(creds.server_addresses) if creds else [],
            "has_ca": bool(creds and creds.cacert_pem),
            "has_token": bool(creds and creds.user_token),
            "updated_at": _iso(creds.updated_at) if creds else None,
        }
    )


# -- cluster permissions (edit) ------------------------------------------------------------


def _permission_json(record: PermissionRecord) -> dict[str, Any]:
    return {
        "cluster_id": record.cluster_id,
        "user_name": record.user_name,
        "user_id": record.user_id,
        "permission": record.permission,
        "updated_at": _iso(record.updated_at),
    }


def _permission_target(ctx: Ctx, user_name: str) -> UserRecord:
    user = ctx.store.find_user(user_name)
    if user is None:
        raise NotFound(f"user {user_name!r} not found", code_name="USER_NOT_FOUND")
    return user


def list_permissions(ctx: Ctx, cluster_id: str) -> Response:
    _, cluster = ctx.require_cluster(cluster_id, EDIT)
    return json_response([_permission_json(p) for p in ctx.store.list_cluster_permissions(cluster.id)])


def get_permission(ctx: Ctx, cluster_id: str, user_name: str) -> Response:
    _, cluster = ctx.require_cluster(cluster_id, EDIT)
    target = _permission_target(ctx, user_name)
    found = ctx.store.list_cluster_permissions(cluster.id, target.id)
    if not found:
        raise NotFound(
            f"user {target.name!r} has no permission on cluster {cluster.id!r}", code_name="PERMISSION_NOT_FOUND"
        )
    return json_response(_permission_json(found[0]))


def put_permission(ctx: Ctx, cluster_id: str, user_name: str) -> Response:
    actor, cluster = ctx.require_cluster(cluster_id, EDIT)
    body = ctx.body()
    validate("cluster_permission_put", body)
    target = _permission_target(ctx, user_name)
    previous = ctx.store.set_cluster_permission(
        cluster.id, target.id, body["permission"], keep_an_editor=not actor.is_superuser,
        limit=ctx.settings.quotas.limit("permissions_per_cluster", actor),
    )
    ctx.store.record_audit(
        actor.name, "cluster_permission.put", f"cluster:{cluster.id}",
        {"user_name": target.name, "old": previous, "new": body["permission"]},
    )
    record = ctx.store.list_cluster_permissions(cluster.id, target.id)[0]
    return json_response(_permission_json(record), 200 if previous else 201)


def delete_permission(ctx: Ctx, cluster_id: str, user_name: str) -> Response:
    # Removing the last edit holder is refused to everyone but superusers: it leaves
    # a cluster that only superusers can manage, never one an edit holder lost by a slip.
    actor, cluster = ctx.require_cluster(cluster_id, EDIT)
    target = _permission_target(ctx, user_name)
    found = ctx.store.list_cluster_permissions(cluster.id, target.id)
    if not found:
        raise NotFound(
            f"user {target.name!r} has no permission on cluster {cluster.id!r}", code_name="PERMISSION_NOT_FOUND"
        )
    previous = ctx.store.set_cluster_permission(cluster.id, target.id, None, keep_an_editor=not actor.is_superuser)
    ctx.store.record_audit(
        actor.name, "cluster_permission.delete", f"cluster:{cluster.id}",
        {"user_name": target.name, "old": previous, "new": None},
    )
    return json_response(_permission_json(found[0]))


def _check_pem(field: str, text: str) -> None:
    try:
        certs = x509.load_pem_x509_certificates(text.encode())
    except ValueError:
        certs = []
    if not certs:
        raise ValidationError(f"{field}: must be a PEM-encoded CA certificate")


def _check_body_register_token(ctx: Ctx, cluster_id: str, value: str) -> None:
    """The source's check of ``register_token`` in the body, with its code names (HTTP 400 as there)."""
    found = ctx.store.check_register_token(cluster_id, value)
    if found is None:
        raise BadRequest("no valid register token found for cluster", code_name="RTOKEN_NOT_FOUND")
    if not found:
        raise BadRequest("invalid register token given", code_name="INVALID_RTOKEN")


def put_credentials(ctx: Ctx, cluster_id: str) -> Response:
    """The kube-agent's report: authenticated by the cluster's register token.

    The Go bcs-kube-agent sends the token as ``register_token`` in the body and no
    ``Authorization`` (the auth layer lets this one route through anonymously); ours
    sends ``Authorization: Bearer``. A token in the body is checked whatever else
    the request carries. As bcs-api did, an anonymous caller learns whether a cluster
    id has a live register token (``RTOKEN_NOT_FOUND`` vs ``INVALID_RTOKEN``), and
    nothing more: an unknown cluster and one without a token answer alike.
    """
    agent = env.get_agent(ctx.environ)
    user = ctx.user
    if agent is not None and agent.cluster_id != cluster_id:
        raise Forbidden(f"this register token does not belong to cluster {cluster_id!r}")
    if agent is None and user is not None and not user.is_superuser:
        raise Forbidden("only the cluster's register token or a superuser may report credentials")
    token = bearer_token(ctx.environ)
    if agent is not None and token and ctx.store.authenticate_register_token(token) != cluster_id:
        # The auth layer caches principals for a few seconds; a revoked or rotated
        # register token must not re-point a cluster in that window.
        raise Unauthorized("invalid, expired or revoked token")
    body = ctx.body()
    validate("credentials_put", body)
    body_token = body.get("register_token")
    if agent is None and user is None and not body_token:
        raise Unauthorized("a register token is required: register_token in the body, or Authorization: Bearer")
    if body_token:
        _check_body_register_token(ctx, cluster_id, body_token)
    actor = ctx.actor if agent is not None or user is not None else f"cluster-agent:{cluster_id}"
    ctx.store.get_cluster(cluster_id)
    addresses = [a for a in body["server_addresses"].split(";") if a]
    for address in addresses:
        parts = urlsplit(address)
        if not parts.hostname or parts.query or parts.fragment or parts.username:
            raise ValidationError("server_addresses: each entry must be an https://host[:port][/path] URL")
        try:
            parts.port  # noqa: B018 - raises on a malformed port
        except ValueError:
            raise ValidationError("server_addresses: an entry has an invalid port") from None
        policy = ctx.settings.address_policy
        refused = policy and policy.literal_refusal(parts.hostname, parts.port or 443)
        if refused:
            raise ValidationError(f"server_addresses: the gateway does not connect to {refused}")
    _check_pem("cacert_data", body["cacert_data"])
    previous, record = ctx.store.report_credentials(
        cluster_id,
        server_addresses=[a.rstrip("/") for a in addresses],
        cacert_pem=body["cacert_data"],
        user_token=body["user_token"],
    )
    # Addresses only: the CA and the service-account token never enter the audit trail.
    ctx.store.record_audit(
        actor, "credentials.put", f"cluster:{cluster_id}",
        {"old_server_addresses": list(previous) if previous is not None else None,
         "server_addresses": list(record.server_addresses)},
    )
    return json_response(
        {"cluster_id": cluster_id, "server_addresses": ";".join(record.server_addresses),
         "updated_at": _iso(record.updated_at)}
    )


def _gateway_base(ctx: Ctx) -> str:
    """The gateway as the client reached it, or the configured public URL.

    A ``Host`` the gateway's certificate does not name would hand the client an
    address that fails TLS verification, so the configured ``public_url`` wins
    then; without one, the client's own ``Host`` is the best we know.
    """
    settings = ctx.settings
    host = ctx.request.host
    scheme = ctx.request.scheme
    if settings.public_url:
        if settings.gateway_cert_pem is None:
            return settings.public_url.rstrip("/")
        from ...pki.certificates import host_matches

        hostname = urlsplit(f"//{host}").hostname or ""
        if not host_matches(settings.gateway_cert_pem, hostname):
            return settings.public_url.rstrip("/")
    return f"{scheme}://{host}"


def _tunnel_path(cluster_id: str) -> str:
    return f"/tunnels/clusters/{cluster_id}/"


def client_credentials(ctx: Ctx, cluster_id: str) -> Response:
    _, cluster = ctx.require_cluster(cluster_id, VIEW)
    path = _tunnel_path(cluster.id)
    return json_response(
        {
            "cluster_id": cluster.id,
            "server_address": _gateway_base(ctx) + path,
            "server_address_path": path,
            "user_token": bearer_token(ctx.environ) or "",
            "cacert_data": ctx.settings.gateway_ca_pem or "",
        }
    )


def kubeconfig(ctx: Ctx, cluster_id: str) -> Response:
    user, cluster = ctx.require_cluster(cluster_id, VIEW)
    name = f"bcs-{cluster.id}"
    cluster_entry: dict[str, Any] = {"server": _gateway_base(ctx) + _tunnel_path(cluster.id)}
    if ctx.settings.gateway_ca_pem:
        import base64

        cluster_entry["certificate-authority-data"] = base64.b64encode(
            ctx.settings.gateway_ca_pem.encode()
        ).decode()
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster_entry}],
        "users": [{"name": f"{name}-{user.name}", "user": {"token": bearer_token(ctx.environ) or ""}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-{user.name}"}}],
        "current-context": name,
        "preferences": {},
    }
    body = yaml.safe_dump(document, sort_keys=False)
    creds = ctx.store.get_credentials(cluster.id)
    not_ready = None
    if creds is None or not creds.server_addresses:
        # Handed out anyway (the agent may be on its way), but never as if it were ready.
        not_ready = (f"cluster {cluster.id} has no credentials yet: its kube-agent has not reported, "
                     "so kubectl cannot reach it until it does")
        body = f"# WARNING: {not_ready}\n{body}"
    response = Response(body, mimetype="application/yaml")
    response.headers["Cache-Control"] = "no-store"
    if not_ready:
        response.headers["Warning"] = f'299 - "{not_ready}"'
    return response
