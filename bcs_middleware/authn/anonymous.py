"""``anonymous`` of the ``AuthenticationConfiguration``: which requests without credentials pass.

kube-apiserver ≥ 1.32 takes ``anonymous: {enabled: bool, conditions: [{path: …}]}`` in the file
(``staging/src/k8s.io/apiserver/pkg/apis/apiserver/types.go``, ``AnonymousAuthConfig``). Its rules,
kept here:

* ``conditions`` need ``enabled: true`` (``validation.go``: "enabled should be set to true when
  conditions are defined");
* the ``--anonymous-auth`` flag and the file's ``anonymous`` cannot both be given
  (``pkg/kubeapiserver/options/authentication.go``); the token auth filter's ``required`` is that
  flag here, and the gateway refuses a configuration that enables anonymous while ``rbac`` is off
  (the cluster would be reached with the gateway's own credential);
* a request is anonymous only when no authenticator found credentials in it: a token that fails
  is a 401 still (``union.NewFailOnError``);
* with conditions, only a request whose path is exactly one of theirs is anonymous
  (``pkg/authentication/request/anonymous/anonymous.go`` compares ``req.URL.Path``, the decoded
  path: ``PATH_INFO`` here); without, every path is;
* the user is ``system:anonymous`` in the group ``system:unauthenticated``, never
  ``system:authenticated``.

What the gateway adds, because it is not one apiserver but a door to many and to its own API:

* on the Kubernetes route (``/tunnels/clusters/{id}/…``) the anonymous user is impersonated
  upstream as ``system:anonymous`` / ``system:unauthenticated``, so each cluster's RBAC decides;
  the gateway lets it reach a cluster only where ``system:unauthenticated`` was granted ``view``
  (by a superuser) or the RBAC subscription grants that group something;
* on the management API (``/rest/…``) it may only read (``GET``/``HEAD``): a write without
  credentials is a 401 whatever the conditions say;
* on no other route of the gateway's (Mesos, the web console, the agent tunnel…): those have no
  RBAC upstream to decide for an anonymous caller;
* a path that is no route of the gateway's belongs to the application behind the token auth
  filter (used alone, :func:`bcs_middleware.layers.auth.filter_factory`): it sees
  ``system:anonymous`` and decides (the gateway itself answers such a path 404);
* it is never a superuser (:data:`~bcs_middleware.core.environ.ANONYMOUS_USER`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.routes import RouteKind

__all__ = ["ANONYMOUS_ROUTES", "READ_METHODS", "AnonymousAuth"]

#: The gateway's routes where a request without credentials may be anonymous: the Kubernetes route
#: (each cluster's RBAC decides what ``system:anonymous`` may do) and the management API (reads only).
ANONYMOUS_ROUTES: frozenset[RouteKind] = frozenset({"kubernetes", "management"})
#: The management API's methods that change nothing.
READ_METHODS = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class AnonymousAuth:
    """The file's ``anonymous``: ``enabled``, and the exact paths of its ``conditions`` (empty: any)."""

    enabled: bool = False
    paths: frozenset[str] = frozenset()

    def admits(self, path: str, method: str, kind: RouteKind | None) -> bool:
        """Whether a request without credentials to ``path`` is ``system:anonymous`` (else a 401)."""
        if not self.enabled or (self.paths and path not in self.paths):
            return False
        if kind == "management":
            return method in READ_METHODS
        return kind is None or kind in ANONYMOUS_ROUTES
