"""The management REST API as a terminal WSGI app (paste app ``management_api``).

Routes (werkzeug ``Map``), who may call them, and what they do are in DESIGN §4;
each route maps to one function in :mod:`.endpoints` (listing and deleting
users and clusters, and the superuser flag: :mod:`.inventory`). Authentication is the token
auth layer's job (it must run in front); this app only reads ``bcs.user`` /
``bcs.agent`` and decides what the caller may do.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request

from ...clusters.permissions import ClusterAccess, ClusterAuthorizer, ClusterCreators, DriverDirectory
from ...core import converters as conv
from ...core.errors import BCSError, InternalError, MethodNotAllowed, NotFound
from ...core.printable import escape
from ...core.quotas import Quotas, limit_value
from ...recording.catalog import RecordingStore
from . import endpoints as ep
from . import identity, inventory, sessions
from .calls import APISettings, Ctx
from .store import ManagementStore

log = logging.getLogger(__name__)

ROUTES = Map(
    [
        Rule("/rest/users/", methods=["POST"], endpoint=ep.create_user),
        Rule("/rest/users/", methods=["GET"], endpoint=inventory.list_users),
        Rule("/rest/users/<user_name>", methods=["GET"], endpoint=ep.get_user),
        Rule("/rest/users/<user_name>", methods=["PUT"], endpoint=inventory.update_user),
        Rule("/rest/users/<user_name>", methods=["DELETE"], endpoint=inventory.delete_user),
        Rule("/rest/users/<int:user_id>/tokens", methods=["POST"], endpoint=ep.create_token),
        Rule("/rest/users/<int:user_id>/tokens", methods=["GET"], endpoint=ep.list_tokens),
        Rule("/rest/users/<int:user_id>/tokens/<int:token_id>", methods=["DELETE"], endpoint=ep.revoke_token),
        Rule("/rest/clusters/bcs", methods=["POST"], endpoint=ep.create_cluster),
        Rule("/rest/clusters/", methods=["GET"], endpoint=inventory.list_clusters),
        Rule("/rest/clusters/<cluster_id>", methods=["GET"], endpoint=ep.get_cluster),
        Rule("/rest/clusters/<cluster_id>", methods=["DELETE"], endpoint=inventory.delete_cluster),
        Rule("/rest/clusters/<cluster_id>/register_tokens", methods=["POST"], endpoint=ep.create_register_token),
        Rule("/rest/clusters/<cluster_id>/register_tokens", methods=["GET"], endpoint=ep.get_register_token),
        Rule("/rest/clusters/<cluster_id>/register_tokens", methods=["DELETE"], endpoint=ep.revoke_register_token),
        Rule("/rest/clusters/<cluster_id>/credentials", methods=["PUT"], endpoint=ep.put_credentials),
        Rule("/clusters/<cluster_id>/credentials", methods=["PUT"], endpoint=ep.put_credentials),
        Rule("/rest/clusters/<cluster_id>/credentials", methods=["GET"], endpoint=ep.credential_status),
        Rule("/clusters/<cluster_id>/credentials", methods=["GET"], endpoint=ep.credential_status),
        Rule("/rest/clusters/<cluster_id>/permissions", methods=["GET"], endpoint=ep.list_permissions),
        Rule("/rest/clusters/<cluster_id>/permissions/<user_name>", methods=["GET"], endpoint=ep.get_permission),
        Rule("/rest/clusters/<cluster_id>/permissions/<user_name>", methods=["PUT"], endpoint=ep.put_permission),
        Rule("/rest/clusters/<cluster_id>/permissions/<user_name>", methods=["DELETE"],
             endpoint=ep.delete_permission),
        Rule("/rest/clusters/<cluster_id>/group_permissions", methods=["GET"],
             endpoint=identity.list_group_permissions),
        Rule("/rest/clusters/<cluster_id>/group_permissions/<group>", methods=["GET"],
             endpoint=identity.get_group_permission),
        Rule("/rest/clusters/<cluster_id>/group_permissions/<group>", methods=["PUT"],
             endpoint=identity.put_group_permission),
        Rule("/rest/clusters/<cluster_id>/group_permissions/<group>", methods=["DELETE"],
             endpoint=identity.delete_group_permission),
        Rule("/rest/whoami", methods=["GET"], endpoint=identity.whoami),
        Rule("/rest/clusters/<cluster_id>/client_credentials", methods=["GET"], endpoint=ep.client_credentials),
        Rule("/clusters/<cluster_id>/client_credentials", methods=["GET"], endpoint=ep.client_credentials),
        Rule("/rest/clusters/<cluster_id>/kubeconfig", methods=["GET"], endpoint=ep.kubeconfig),
        Rule("/rest/sessions", methods=["GET"], endpoint=sessions.list_sessions),
        Rule("/rest/sessions/<session_id>", methods=["GET"], endpoint=sessions.get_session),
        Rule("/rest/sessions/<session_id>/recording", methods=["GET"], endpoint=sessions.get_recording),
    ],
    strict_slashes=False,
    merge_slashes=False,
)


class ManagementAPI:
    """Users, tokens, clusters, register tokens and credentials over JSON.

    :param store: what the endpoints call (:class:`.store.ManagementStore`; ``SQLStore`` has it).
    :param settings: what the API hands out (gateway CA, public URL) and its body limit.
    :param access: who may use and manage which cluster; by default the store's
        permission table, asked on every request.
    :param fallback: a WSGI app for paths this API has no route for (the admission
        definitions API, for example); ``None`` answers 404.
    :param drivers: the gateway's discovery of mesos-drivers: an id they serve can
        only be registered by a superuser (:func:`~bcs_middleware.clusters.permissions.reserved_cluster_id`).
    :param recordings: where recorded exec/attach sessions live (``/rest/sessions``); ``None``
        answers those routes 404.
    """

    def __init__(
        self,
        store: ManagementStore,
        *,
        settings: APISettings | None = None,
        access: ClusterAccess | None = None,
        fallback: Any = None,
        drivers: DriverDirectory | None = None,
        recordings: RecordingStore | None = None,
    ) -> None:
        self.store = store
        self.settings = settings or APISettings()
        self.access = access or ClusterAuthorizer(store)
        self.fallback = fallback
        self.drivers = drivers
        self.recordings = recordings

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        request = Request(environ)
        adapter = ROUTES.bind_to_environ(environ)
        try:
            try:
                endpoint, values = adapter.match()
            except HTTPException as exc:
                if self.fallback is not None and exc.code == 404:
                    return self.fallback(environ, start_response)
                if exc.code == 405:
                    raise MethodNotAllowed(f"{request.method} is not allowed on {request.path}") from None
                raise NotFound(f"no such API route: {request.path}") from None
            ctx = Ctx(request, self.store, self.settings, self.access, self.drivers, self.recordings)
            response = endpoint(ctx, **values)
        except BCSError as exc:
            return exc(environ, start_response)
        except Exception:
            # Logged with the traceback for the operator; the client gets no internals.
            log.exception("unhandled error in %s %s", escape(request.method), escape(request.path))
            return InternalError("internal error; see the gateway log")(environ, start_response)
        return response(environ, start_response)


_OPTIONS: dict[str, conv.Converter] = {
    "database_url": conv.text,
    "data_dir": conv.text,
    "secret_key": conv.text,
    "gateway_ca_file": conv.text,
    "gateway_cert_file": conv.text,
    "public_url": conv.url,
    "max_body": conv.size,
    "cluster_creators": ClusterCreators.parse,
    **{f"quota_{name}": limit_value for name in Quotas.names()},
}


def settings_from(opts: Mapping[str, Any]) -> APISettings:
    ca_file = opts.get("gateway_ca_file")
    cert_file = opts.get("gateway_cert_file")
    return APISettings(
        gateway_ca_pem=Path(ca_file).read_text() if ca_file else None,
        gateway_cert_pem=Path(cert_file).read_bytes() if cert_file else None,
        public_url=opts.get("public_url"),
        max_body=opts.get("max_body", 1024 * 1024),
        quotas=quotas_from(opts),
        cluster_creators=opts.get("cluster_creators", ClusterCreators()),
    )


def quotas_from(opts: Mapping[str, Any]) -> Quotas:
    """The ``quota_*`` options (already converted) as :class:`Quotas`; absent ones keep their defaults."""
    prefix = "quota_"
    return Quotas(**{k[len(prefix):]: v for k, v in opts.items() if k.startswith(prefix)})


def app_factory(global_conf: Mapping[str, Any], **local_conf: Any) -> ManagementAPI:
    """PasteDeploy app ``egg:bcs-middleware#management_api`` (put ``token_auth`` in front)::

        [app:api]
        use = egg:bcs-middleware#management_api
        database_url = postgresql://bcs@db/bcs
        gateway_ca_file = /etc/bcs/ca.crt
        max_body = 1MiB
        # who may register clusters: everyone | superusers | user:NAME group:NAME ...
        cluster_creators = everyone
        # per-user quotas (a number, or unlimited; superusers are exempt)
        quota_clusters_per_user = 50
        quota_tokens_per_user = 20
        quota_webhook_configurations_per_cluster = 20
        quota_permissions_per_cluster = 200
    """
    from ...store.sql import open_store

    opts = conv.convert_options("app:management_api", local_conf, _OPTIONS)
    store = open_store(opts.get("database_url"), data_dir=opts.get("data_dir"), secret_key=opts.get("secret_key"))
    return ManagementAPI(store, settings=settings_from(opts))
