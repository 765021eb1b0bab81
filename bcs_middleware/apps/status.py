"""The gateway's own status endpoints: ``/healthz``, ``/readyz`` and ``/metrics``.

* ``/healthz`` answers ``200 {"status": "ok"}`` while the process serves at all;
* ``/readyz`` answers ``200`` when the store answers and discovery is fresh (a stale
  snapshot still routes, but says so), else ``503`` with what is not ready;
* ``/metrics`` is Prometheus's text format for superusers and the holder of the metrics
  token only: its labels name clusters, webhooks and upstreams — records a caller may get
  a 404 for — so, as kube-apiserver's own ``/metrics``, it is not for anyone.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Iterable
from typing import Any, Protocol

from ..core import environ as env
from ..core.errors import Forbidden, Unauthorized
from ..layers.auth import bearer_token
from ..store.crypto import token_digest
from ..telemetry.metrics import BATCH


class Pingable(Protocol):
    def ping(self) -> bool: ...


class Freshness(Protocol):
    def stale(self) -> bool: ...


def json_response(start_response: Any, status: str, body: dict[str, Any]) -> list[bytes]:
    payload = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))])
    return [payload]


def health_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """``/healthz``: the process answers."""
    return json_response(start_response, "200 OK", {"status": "ok"})


class ReadinessApp:
    """``/readyz``: ready = the store answers and discovery (when there is one) is fresh."""

    def __init__(self, store: Pingable, discovery: Freshness | None = None) -> None:
        self.store = store
        self.discovery = discovery

    def readiness(self) -> tuple[bool, dict[str, str]]:
        report = {"store": "ok" if self.store.ping() else "unreachable"}
        if self.discovery is not None:
            report["discovery"] = "stale" if self.discovery.stale() else "ok"
        return all(v == "ok" for v in report.values()), report

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        ready, report = self.readiness()
        if ready:
            return json_response(start_response, "200 OK", {"status": "ready", **report})
        return json_response(start_response, "503 Service Unavailable", {"status": "not ready", **report})


class MetricsApp:
    """``/metrics`` for superusers and for the scraper presenting ``metrics_token``.

    :param metrics_token: the SHA-256 digest of the scraper's token (``Authorization:
        Bearer``, compared in constant time); ``None``: superusers only.
    """

    def __init__(self, metrics_token: str | None = None) -> None:
        self.metrics_token = metrics_token

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        user = env.get_user(environ)
        if user is not None and user.is_superuser:
            return metrics_app(environ, start_response)
        token = bearer_token(environ)
        if self.metrics_token and token and hmac.compare_digest(token_digest(token), self.metrics_token):
            return metrics_app(environ, start_response)
        if user is None:
            return Unauthorized("/metrics needs a superuser's token or the metrics token")(environ, start_response)
        return Forbidden("/metrics is for superusers and the metrics token")(environ, start_response)


def metrics_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """Prometheus's text format of this process's registry (or of every worker's, multiprocess)."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client import REGISTRY as DEFAULT_REGISTRY

    BATCH.flush()  # what this worker counted is current; other workers' within 0.25 s
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = DEFAULT_REGISTRY
    payload = generate_latest(registry)
    start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST), ("Content-Length", str(len(payload)))])
    return [payload]
