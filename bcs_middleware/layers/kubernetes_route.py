"""Cluster routing for the Kubernetes tunnel.

:class:`ClusterRoutingMiddleware` turns ``/tunnels/clusters/{cluster_id}/{rest}``
into an :class:`~bcs_middleware.core.environ.Upstream` for the proxy: the cluster's
apiserver addresses, the CA and service-account token its kube-agent reported,
and — with RBAC on and a non-superuser caller — the identity to impersonate
(:class:`~bcs_middleware.core.impersonation.Impersonation`), so the cluster's own RBAC
decides what the user may do.

Security notes:

* every ``Impersonate-*`` header the client sends (any case, including
  ``Impersonate-Extra-*`` and ``Impersonate-Uid``) is refused with 403: a client
  never chooses its identity upstream;
* the client's ``Authorization`` is replaced by the cluster's credential (the
  proxy drops it; this layer supplies ``Upstream.bearer_token``);
* a path that would leave the cluster's prefix (``..``, ``.``, encoded ``/`` or
  ``\\``) is refused with 400 before anything is looked up;
* a user without ``view`` on the cluster (:mod:`bcs_middleware.clusters.permissions`) gets
  the very 404 a cluster that does not exist gets, before anything else is said
  about the cluster (its type, whether it has credentials) and before anything
  is sent upstream.

Errors are Kubernetes ``Status`` objects so kubectl prints them.

Reads ``bcs.facts`` (:func:`bcs_middleware.core.facts.of`: the route, the cluster id and
the API path, classified on demand when this layer runs alone), ``QUERY_STRING``,
``bcs.user``; sets ``bcs.cluster``, ``bcs.upstream`` (whose ``path`` is the path upstream
and whose ``impersonate`` is the identity the cluster acts as) and ``bcs.error_style``.
Requests on other routes pass through untouched.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

from ..clusters.directory import CachedDirectory, ClusterDirectory, upstream_for
from ..clusters.permissions import VIEW, ClusterAccess, ClusterAuthorizer, cluster_not_found
from ..core import converters as conv
from ..core import environ as env
from ..core import facts as request_facts
from ..core.cache import Cache
from ..core.errors import BadRequest, BCSError, ClusterNotReady, Forbidden, Unauthorized
from ..core.impersonation import Impersonation
from ..core.shapes import small_shape


def client_impersonation_keys(environ: Mapping[str, Any]) -> tuple[str, ...]:
    """The environ keys of every ``Impersonate-*`` header the client sent."""
    return _impersonation_keys(tuple(environ))


def _scan_impersonation(keys: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(k for k in keys if k.startswith("HTTP_IMPERSONATE_"))


# A client's requests carry the same environ keys each time: scanned once per shape.
_impersonation_keys: Cache[tuple[str, ...], tuple[str, ...]] = Cache(
    max_entries=256, loader=_scan_impersonation, admit=small_shape)


class ClusterRoutingMiddleware:
    """Route ``/tunnels/clusters/{cluster_id}/…`` to the cluster's apiserver.

    :param app: the next layer (admission, then the upstream proxy).
    :param directory: clusters and credentials (the store, usually cached).
    :param access: who may use which cluster; a cached
        :class:`~bcs_middleware.clusters.permissions.ClusterAuthorizer` (the tunnel is the hot path).
    :param rbac: add ``Impersonate-User``/``Impersonate-Group`` for non-superusers,
        so the cluster's RBAC decides. Off, every user acts with the credential's
        own rights (the source system's ``turn_on_rbac: false``).
    :param tls_server_name: verify every apiserver certificate against this name
        instead of the reported host (the source system always used ``kubernetes``).
    :param verify: ``False`` disables TLS verification towards apiservers — never
        the default; logged at start by the factory.
    """

    def __init__(
        self,
        app: Any,
        *,
        directory: ClusterDirectory | CachedDirectory,
        access: ClusterAccess,
        rbac: bool = True,
        tls_server_name: str | None = None,
        verify: bool = True,
    ) -> None:
        self.app = app
        self.directory = directory if isinstance(directory, CachedDirectory) else CachedDirectory(directory)
        self.access = access
        self.rbac = rbac
        self.tls_server_name = tls_server_name or None
        self.verify = verify

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        facts = request_facts.of(environ)
        if not facts.kubernetes:
            return self.app(environ, start_response)
        environ[env.ERROR_STYLE] = "kubernetes"
        try:
            self.route(environ, facts)
        except BCSError as exc:
            return exc(environ, start_response)
        return self.app(environ, start_response)

    def route(self, environ: dict[str, Any], facts: request_facts.RequestFacts) -> None:
        facts.refuse()
        assert facts.cluster_id is not None  # not refused
        refused = client_impersonation_keys(environ)
        if refused:
            name = refused[0][5:].replace("_", "-").title()
            raise Forbidden(f"the {name} header is not allowed through the gateway", code_name="IMPERSONATION_REFUSED")
        user = env.get_user(environ)
        if user is None:
            if env.get_agent(environ) is not None:
                raise Forbidden("a register token cannot be used to reach a cluster")
            raise Unauthorized("a gateway token is required")
        cluster, creds = self.directory.lookup(facts.cluster_id)
        if cluster is None or not self.access.allows(user, cluster.id, VIEW):
            raise cluster_not_found(facts.cluster_id)
        if cluster.cluster_type != "k8s":
            raise BadRequest(f"cluster {cluster.id!r} is not a Kubernetes cluster", code_name="NOT_KUBERNETES")
        if creds is None or not creds.server_addresses:
            raise ClusterNotReady(
                f"cluster {cluster.id!r} has no credentials yet: its kube-agent has not reported "
                "(is it running? see README: Register a cluster)"
            )
        environ[env.CLUSTER] = env.Cluster(cluster.id, cluster.project_id, "k8s")
        impersonate = _impersonation(user) if self.rbac and not user.is_superuser else None
        environ[env.UPSTREAM] = upstream_for(
            creds, impersonate=impersonate, path=facts.api_path,
            query=environ.get("QUERY_STRING", ""), server_name=self.tls_server_name, verify=self.verify,
        )


@functools.lru_cache(maxsize=4096)
def _impersonation(user: env.User) -> Impersonation:
    """The identity a non-superuser's requests carry to the cluster (users are immutable: cached):
    every group Kubernetes would see them in, and the uid and extra their identity provider mapped
    (kube-apiserver sends all of them on to admission and authorization)."""
    return Impersonation(user.name, user.kubernetes_groups, uid=user.uid, extra=user.extra)


_OPTIONS: dict[str, conv.Converter] = {
    "database_url": conv.text,
    "secret_key": conv.text,
    "rbac": conv.asbool,
    "tls_server_name": conv.text,
    "verify": conv.asbool,
    "cache_ttl": conv.seconds,
    "rbac_grants": conv.asbool,
}


def filter_factory(global_conf: Mapping[str, Any], **local_conf: Any) -> Any:
    """PasteDeploy filter ``egg:bcs-middleware#cluster_routing``::

        [filter:cluster_routing]
        use = egg:bcs-middleware#cluster_routing
        database_url = postgresql://bcs@db/bcs
        rbac = true
        tls_server_name = kubernetes
        # also give view to users the RBAC subscription grants something on a cluster
        rbac_grants = false
    """
    import logging

    from ..store.sql import open_store

    opts = conv.convert_options("filter:cluster_routing", local_conf, _OPTIONS)
    if not opts.get("database_url"):
        raise conv.ConfigError("[filter:cluster_routing] database_url is required")
    store = open_store(opts["database_url"], secret_key=opts.get("secret_key"), migrate=False)
    if store.db.secrets.locked:
        raise conv.ConfigError("[filter:cluster_routing] needs secret_key (or env BCS_SECRET_KEY) to read credentials")
    if opts.get("verify") is False:
        logging.getLogger(__name__).warning(
            "TLS verification towards cluster apiservers is OFF (verify = false)"
        )
    directory = CachedDirectory(store, ttl=opts.get("cache_ttl", 5.0))
    access = ClusterAuthorizer(store, rbac_grants=opts.get("rbac_grants", False), ttl=opts.get("cache_ttl", 5.0))

    def make(app: Any) -> ClusterRoutingMiddleware:
        return ClusterRoutingMiddleware(
            app,
            directory=directory,
            access=access,
            rbac=opts.get("rbac", True),
            tls_server_name=opts.get("tls_server_name"),
            verify=opts.get("verify", True),
        )

    return make
