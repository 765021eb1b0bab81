"""The request classified once: route, cluster, API path, Kubernetes attributes, upgrade.

:func:`classify` is pure: from the environ as the server gave it, it computes a frozen
:class:`RequestFacts` — which route owns the path (:mod:`.routes`), for the Kubernetes
route the cluster id and the path as it will be forwarded (checked and re-encoded by
:mod:`.paths`), the request as kube-apiserver classifies it (:mod:`.requestinfo`), the
upgrade protocol (:mod:`.http`) and whether the request is long-running. The first layer
(:class:`~bcs_middleware.layers.request_context.RequestContextMiddleware`) classifies
before anything is looked up and keeps the value under ``bcs.facts``; every later layer
reads it through :func:`of`, which classifies on demand when a layer runs without that
first layer (a PasteDeploy filter used alone). No layer parses the path or the upgrade
headers itself: a layer that decided differently would be a way around the others.

A Kubernetes-route path the gateway refuses (``.``/``..`` segments, a backslash, a NUL,
an encoded ``/`` or ``\\``, no cluster id) is classified too — as a non-resource request
whose path is percent-encoded here, so nothing a client sent reaches a log raw — with
the refusal kept in :attr:`RequestFacts.refusal`; the routing layer answers it with a
400 at the point it always has (after authentication), once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from . import environ as env
from .cache import Cache
from .errors import BadRequest
from .http import upgrade_protocol
from .paths import parse_tunnel_path
from .requestinfo import RequestInfo
from .requestinfo import classify as classify_request
from .routes import KUBERNETES_PREFIX, Route, RouteKind, match

__all__ = ["RequestFacts", "classify", "of", "reclassified"]


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What every layer knows about one request, decided once.

    :param route: the route that owns the path (:func:`bcs_middleware.core.routes.match`),
        ``None`` when none does.
    :param cluster_id: the Kubernetes route's cluster id; ``None`` on other routes and
        for a refused path.
    :param api_path: on the Kubernetes route, the path sent upstream (percent-encoded,
        always starting with ``/``); elsewhere ``PATH_INFO``.
    :param info: the request as kube-apiserver classifies it (of the decoded API path on
        the Kubernetes route, of ``PATH_INFO`` elsewhere).
    :param upgrade: the ``Upgrade`` protocol of a connection upgrade the gateway splices,
        ``None`` for an ordinary request.
    :param refusal: why a Kubernetes-route path is refused (a 400), ``None`` when it is not.
    """

    route: Route | None
    cluster_id: str | None
    api_path: str
    info: RequestInfo
    upgrade: str | None = None
    refusal: str | None = None

    @property
    def kind(self) -> RouteKind | None:
        return self.route.kind if self.route is not None else None

    @property
    def kubernetes(self) -> bool:
        """On the Kubernetes route (``/tunnels/clusters/…``), refused or not."""
        return self.route is not None and self.route.kind == "kubernetes"

    @property
    def label(self) -> str:
        """The ``kind`` of metrics and access-log lines."""
        return self.route.label if self.route is not None else "other"

    @property
    def long_running(self) -> bool:
        """Held open: watch, proxy, exec, attach, port-forward, logs (kube-apiserver's check)."""
        return self.info.long_running

    def refuse(self) -> None:
        """Raise the 400 of a refused Kubernetes-route path (nothing for any other)."""
        if self.refusal is not None:
            raise BadRequest(self.refusal, code_name="BAD_PATH")


def classify(environ: dict[str, Any]) -> RequestFacts:
    """The :class:`RequestFacts` of a request (pure but for the memoized upgrade decision)."""
    path = str(environ.get("PATH_INFO", ""))
    method = str(environ.get("REQUEST_METHOD", "GET"))
    query = str(environ.get("QUERY_STRING", ""))
    raw_uri = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    upgrade = upgrade_protocol(environ)
    return _facts.load((path, method, query, raw_uri, upgrade))


def _classify(key: tuple[str, str, str, str | None, str | None]) -> RequestFacts:
    path, method, query, raw_uri, upgrade = key
    route = match(path, method)
    if route is None or route.kind != "kubernetes":
        return RequestFacts(route, None, path, classify_request(method, path, query), upgrade)
    try:
        tunnel = parse_tunnel_path(path, raw_uri)
    except BadRequest as exc:
        # Named in events and log lines as the client sent it, every byte percent-encoded
        # (WSGI strings carry the request's bytes as latin-1: they are encoded back first).
        raw = path[len(KUBERNETES_PREFIX):].partition("/")[2]
        encoded = quote(("/" + raw).encode("latin-1", "replace"), safe="/")
        info = RequestInfo(is_resource=False, path=encoded, verb=method.lower())
        return RequestFacts(route, None, encoded, info, upgrade, refusal=exc.message)
    assert tunnel is not None  # the route matched the prefix
    return RequestFacts(route, tunnel.cluster_id, tunnel.rest,
                        classify_request(method, unquote(tunnel.rest), query), upgrade)



# A client repeats its requests (lists, watches, gets of the same objects): the facts of a
# request line are worked out once. Bounded: 1024 entries of at most _CACHED characters.
_CACHED = 1024
_facts: Cache[tuple[str, str, str, str | None, str | None], RequestFacts] = Cache(
    max_entries=1024, loader=_classify,
    admit=lambda key: len(key[0]) + len(key[2]) + len(key[3] or "") <= _CACHED)

def of(environ: dict[str, Any]) -> RequestFacts:
    """The request's facts: those the first layer kept, else classified now and kept."""
    facts = environ.get(env.FACTS)
    if type(facts) is RequestFacts:
        return facts
    facts = environ[env.FACTS] = classify(environ)
    return facts


def reclassified(environ: dict[str, Any], api_path: str, query: str) -> RequestFacts:
    """The facts after admission changed what is forwarded (CONNECT options it admitted):
    the API path (percent-encoded) and query that now go upstream, classified again."""
    facts = of(environ)
    method = str(environ.get("REQUEST_METHOD", "GET"))
    updated = RequestFacts(facts.route, facts.cluster_id, api_path,
                           classify_request(method, unquote(api_path), query), facts.upgrade, facts.refusal)
    environ[env.FACTS] = updated
    return updated
