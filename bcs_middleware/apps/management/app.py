"""The management REST API as a terminal WSGI app (its paste app ``management_api`` is built in
:mod:`bcs_middleware.compose.management`, from the gateway's typed configuration).

Routes (werkzeug ``Map``), who may call them, and what they do are in DESIGN §4;
each route maps to one function in :mod:`.endpoints` (listing and deleting
users and clusters, and the superuser flag: :mod:`.inventory`). Authentication is the token
auth layer's job (it must run in front); this app only reads ``bcs.user`` /
``bcs.agent`` and decides what the caller may do.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request

from ...clusters.permissions import ClusterAccess, ClusterAuthorizer, DriverDirectory
from ...core.errors import BCSError, InternalError, MethodNotAllowed, NotFound
from ...core.printable import escape
from ...recording.catalog import SessionReader
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
        recordings: SessionReader | None = None,
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
