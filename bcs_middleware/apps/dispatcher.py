"""The gateway's dispatcher: each request to the part of the gateway that owns its route.

The route was matched once, by the request's facts (:func:`bcs_middleware.core.facts.of`
over the table in :mod:`bcs_middleware.core.routes`); this only looks the kind up, as
werkzeug's ``DispatcherMiddleware`` picks an app by prefix. A route whose part is not
configured here (no Mesos route without discovery, the driver's own paths, the agent
tunnel handled in front of authentication) and a path no route owns are a ``404``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..core import facts as request_facts
from ..core.errors import NotFound
from ..core.routes import RouteKind
from .status import Freshness, MetricsApp, Pingable, ReadinessApp, health_app

WSGIApp = Callable[[dict[str, Any], Any], Iterable[bytes]]


class GatewayDispatcher:
    """Send each request to the app of its route kind.

    :param api: the management API (``/rest/…``, ``/clusters/…``, the agent report).
    :param tunnel: the Kubernetes route (routing, admission, the proxy).
    :param store: what ``/readyz`` pings.
    :param rbac_status: ``/rest/rbac/status``; ``None``: the management API answers it.
    :param mesos: the Mesos route; ``None``: none.
    :param discovery: whose freshness ``/readyz`` reports.
    :param webconsole: the web console route; ``None``: none.
    :param metrics_token: the digest of the scraper's ``/metrics`` token.
    """

    def __init__(
        self,
        *,
        api: WSGIApp,
        tunnel: WSGIApp,
        store: Pingable,
        rbac_status: WSGIApp | None = None,
        mesos: WSGIApp | None = None,
        discovery: Freshness | None = None,
        webconsole: WSGIApp | None = None,
        metrics_token: str | None = None,
    ) -> None:
        self.readyz = ReadinessApp(store, discovery)
        self.metrics = MetricsApp(metrics_token)
        apps: dict[RouteKind, WSGIApp | None] = {
            "kubernetes": tunnel,
            "health": health_app,
            "readiness": self.readyz,
            "metrics": self.metrics,
            "mesos": mesos,
            "webconsole": webconsole,
            "rbac_status": rbac_status if rbac_status is not None else api,
            "management": api,
            "agent_report": api,
        }
        self.apps = {kind: app for kind, app in apps.items() if app is not None}

    def readiness(self) -> tuple[bool, dict[str, str]]:
        """Ready = the store answers and discovery is fresh (a stale snapshot still routes)."""
        return self.readyz.readiness()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        kind = request_facts.of(environ).kind
        app = self.apps.get(kind) if kind is not None else None
        if app is None:
            return NotFound(f"no route for {environ.get('PATH_INFO', '')}")(environ, start_response)
        return app(environ, start_response)
