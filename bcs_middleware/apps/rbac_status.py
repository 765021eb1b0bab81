"""``GET /rest/rbac/status`` (superusers): what the RBAC reconciler last did, from any gateway process.

The answer is read from the store, where the leader writes it, so every worker
of every gateway machine shows the same thing::

    {"enabled": true,
     "leader": {"holder": "gw1:4242:1a2b3c4d", "expires_at": "…", "acquired_at": "…", "active": true},
     "source": {"source": "file:/etc/bcs/rbac.yaml", "grants": 12, "grants_digest": "…",
                "loaded_at": "…", "error": null, "checked_at": "…", "holder": "…"},
     "clusters": [{"cluster_id": "BCS-K8S-001", "result": "ok", "created": 2, "updated": 0,
                   "deleted": 1, "unchanged": 9, "failed": 0, "error": null, "errors": [],
                   "retry_in": null, "started_at": "…", "finished_at": "…", "grants_digest": "…",
                   "holder": "…"}]}

It reads ``bcs.user`` (set by the token auth layer) and sets nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from werkzeug.wrappers import Response

from ..core import environ as env
from ..core.errors import BCSError, Forbidden, MethodNotAllowed, Unauthorized
from ..rbac.leader import LeaderLease, LeaseStore
from ..rbac.service import CLUSTER_SCOPE, SOURCE_SCOPE, read_status

STATUS_PATH = "/rest/rbac/status"


def status_document(store: LeaseStore, *, enabled: bool = True) -> dict[str, Any]:
    if not enabled:
        return {"enabled": False, "leader": None, "source": None, "clusters": []}
    rows = read_status(store)
    return {
        "enabled": True,
        "leader": LeaderLease(store, name="rbac", holder="-").current(),
        "source": rows.get(SOURCE_SCOPE),
        "clusters": [doc for scope, doc in rows.items() if scope.startswith(CLUSTER_SCOPE)],
    }


class RBACStatusApp:
    """The WSGI app answering ``GET /rest/rbac/status``; mount it at that path.

    :param store: the shared database the leader writes its status to.
    :param enabled: ``False`` (RBAC sync off) answers ``{"enabled": false, …}``.
    """

    def __init__(self, store: LeaseStore, *, enabled: bool = True) -> None:
        self.store = store
        self.enabled = enabled

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        try:
            if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
                raise MethodNotAllowed("only GET is allowed here", headers=[("Allow", "GET, HEAD")])
            user = env.get_user(environ)
            if user is None:
                raise Unauthorized("missing bearer token")
            if not user.is_superuser:
                raise Forbidden(f"user {user.name!r} is not a superuser")
            document = status_document(self.store, enabled=self.enabled)
        except BCSError as exc:
            return exc(environ, start_response)
        response = Response(json.dumps(document), mimetype="application/json")
        response.headers["Cache-Control"] = "no-store"
        return response(environ, start_response)

