"""The route table of the gateway and the driver: which part of the server owns a path.

One werkzeug :class:`~werkzeug.routing.Map` names every kind of request the servers
answer; the dispatcher, the request classifier (:mod:`.facts`), the access log and
metrics ``kind``, token auth's anonymous agent report and admission's exemption of
webhook definitions all read it, so no layer decides with its own copy of a prefix.
Paths are matched exactly as they arrive (the decoded ``PATH_INFO``): no slash is
merged, none is added or removed, nothing redirects — a path this table does not name
has no route (``None``).

=======================  ==========================================================
kind                     paths
=======================  ==========================================================
``kubernetes``           ``/tunnels/clusters/{cluster_id}`` and below it: the
                         Kubernetes route (the cluster id and the rest are checked
                         by :mod:`.paths`; an empty id is a 400 there, not here)
``agent_report``         ``PUT /rest/clusters/{id}/credentials`` and
                         ``PUT /clusters/{id}/credentials`` (a trailing ``/`` too):
                         the kube-agent's report, whose token is in the body
``rbac_status``          ``/rest/rbac/status``
``management``           anything else under ``/rest/`` or ``/clusters/``
``mesos``                ``/bcsapi/v4/scheduler/mesos/…`` (bcs-api's Mesos route)
``webconsole``           ``/bcsapi/v1/webconsole/…``
``agent_connect``        ``/bcsapi/v1/websocket/connect`` (the agent tunnel)
``bcsapi``               any other ``/bcsapi/…`` path (no route on the gateway)
``driver``               ``/mesosdriver/…`` (the driver's own API)
``health``               ``/healthz``
``readiness``            ``/readyz``
``metrics``              ``/metrics``
=======================  ==========================================================

Webhook-definition routes (``…/namespaces/{ns}/admissionwebhook[/{name}]``,
``…/admissionwebhooks`` under the driver and the Mesos route; ``/rest/admissionwebhooks
[/{name}]``, ``/rest/clusters/{id}/admissionwebhookconfigurations[/{kind}/{name}]`` and
``/rest/admission/review``; each with or without a trailing ``/``) keep their area's kind
and are marked :attr:`Route.definitions`: no webhook intercepts a change to webhook
definitions, or a webhook that refused them could never be removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from werkzeug.exceptions import HTTPException
from werkzeug.routing import BaseConverter, Map, Rule

from .cache import Cache

__all__ = [
    "AGENT_CONNECT_PATH",
    "KUBERNETES_PREFIX",
    "MESOS_PREFIX",
    "WEBCONSOLE_PREFIX",
    "Route",
    "RouteKind",
    "match",
]

RouteKind = Literal[
    "kubernetes", "agent_report", "rbac_status", "management", "mesos", "webconsole",
    "agent_connect", "bcsapi", "driver", "health", "readiness", "metrics",
]

#: The Kubernetes route: ``{KUBERNETES_PREFIX}{cluster_id}/{api path}``.
KUBERNETES_PREFIX = "/tunnels/clusters/"
#: bcs-api's Mesos route on the gateway (``BCS-ClusterID`` names the cluster).
MESOS_PREFIX = "/bcsapi/v4/scheduler/mesos/"
#: bcs-api's web console route on the gateway.
WEBCONSOLE_PREFIX = "/bcsapi/v1/webconsole/"
#: Where a kube-agent opens its tunnel (bk-bcs ``bcs-k8s-watch``/``kube-agent``'s websocket URL).
AGENT_CONNECT_PATH = "/bcsapi/v1/websocket/connect"
#: The driver's own API.
DRIVER_PREFIX = "/mesosdriver/v4/"


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request goes.

    :param kind: the part of the server that owns the path (see the module table).
    :param definitions: a webhook-definition route (admission does not intercept it).
    """

    kind: RouteKind
    definitions: bool = False

    @property
    def label(self) -> str:
        """The ``kind`` of request metrics and access-log lines (a closed set)."""
        return _LABELS[self.kind]


_LABELS: dict[str, str] = {
    "kubernetes": "tunnel", "agent_report": "rest", "rbac_status": "rest", "management": "rest",
    "mesos": "mesos", "webconsole": "mesos", "bcsapi": "mesos", "driver": "mesos",
    "agent_connect": "agent", "health": "other", "readiness": "other", "metrics": "other",
}


class _Segment(BaseConverter):
    """One path segment, possibly empty (``/tunnels/clusters//x`` names no cluster: a 400 later)."""

    regex = "[^/]*"


class _Tail(BaseConverter):
    """The rest of the path, whatever it holds: slashes (a doubled one too), newlines, nothing."""

    regex = "[\\s\\S]*"
    part_isolating = False


def _slashed(path: str) -> list[str]:
    """``path`` and ``path/``: the definition and report routes accept both, as before."""
    return [path, path + "/"]


def _definitions(prefix: str, kind: RouteKind) -> list[Rule]:
    route = Route(kind, definitions=True)
    return [
        Rule(path, endpoint=route)
        for base in (f"{prefix}/namespaces/<ns>/admissionwebhook", f"{prefix}/namespaces/<ns>/admissionwebhook/<name>",
                     f"{prefix}/admissionwebhooks")
        for path in _slashed(base)
    ]


def _table() -> list[Rule]:
    rules = [
        Rule("/tunnels/clusters/<seg:cluster_id>", endpoint=Route("kubernetes")),
        Rule("/tunnels/clusters/<seg:cluster_id>/<tail:rest>", endpoint=Route("kubernetes")),
        *(Rule(path, methods=["PUT"], endpoint=Route("agent_report"))
          for base in ("/rest/clusters/<cluster_id>/credentials", "/clusters/<cluster_id>/credentials")
          for path in _slashed(base)),
        Rule("/rest/rbac/status", endpoint=Route("rbac_status")),
        Rule("/rest/<tail:rest>", endpoint=Route("management")),
        Rule("/clusters/<tail:rest>", endpoint=Route("management")),
        Rule("/bcsapi/v4/scheduler/mesos/<tail:rest>", endpoint=Route("mesos")),
        Rule("/bcsapi/v1/webconsole/<tail:rest>", endpoint=Route("webconsole")),
        Rule(AGENT_CONNECT_PATH, endpoint=Route("agent_connect")),
        Rule("/bcsapi/<tail:rest>", endpoint=Route("bcsapi")),
        Rule("/mesosdriver/<tail:rest>", endpoint=Route("driver")),
        Rule("/healthz", endpoint=Route("health")),
        Rule("/readyz", endpoint=Route("readiness")),
        Rule("/metrics", endpoint=Route("metrics")),
        *_definitions("/mesosdriver/v4", "driver"),
        *_definitions("/bcsapi/v4/scheduler/mesos", "mesos"),
    ]
    rest = Route("management", definitions=True)
    for base in ("/rest/admissionwebhooks", "/rest/admissionwebhooks/<name>",
                 "/rest/clusters/<cluster_id>/admissionwebhookconfigurations",
                 "/rest/clusters/<cluster_id>/admissionwebhookconfigurations/<kind>/<name>",
                 "/rest/admission/review"):
        rules.extend(Rule(path, endpoint=rest) for path in _slashed(base))
    return rules


ROUTES = Map(
    _table(), converters={"seg": _Segment, "tail": _Tail},
    merge_slashes=False, redirect_defaults=False,
)
_ADAPTER = ROUTES.bind("gateway")


def match(path: str, method: str = "GET") -> Route | None:
    """The route of ``method path`` (``PATH_INFO``, decoded), ``None`` when none owns it."""
    return _matches.load((path, method))


def _match(key: tuple[str, str]) -> Route | None:
    path, method = key
    # werkzeug strips leading slashes; a route here is the path exactly as written.
    if not path.startswith("/") or path.startswith("//"):
        return None
    try:
        route: Route = _ADAPTER.match(path, method)[0]
    except HTTPException:  # NotFound, MethodNotAllowed, RequestRedirect (a missing trailing "/")
        return None
    return route


# A client repeats its paths (list, watch, get the same objects): matching one against
# the table is done once per path and method. Bounded: 4096 entries of at most
# _CACHED_PATH characters.
_CACHED_PATH = 512
_matches: Cache[tuple[str, str], Route | None] = Cache(
    max_entries=4096, loader=_match, admit=lambda key: len(key[0]) <= _CACHED_PATH)
