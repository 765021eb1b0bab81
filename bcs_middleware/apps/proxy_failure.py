"""How a failure to reach the upstream becomes the client's answer (the proxy's one such place)."""

from __future__ import annotations

import logging
from typing import Any

from ..core import environ as env
from ..core.errors import BCSError, UpstreamUnreachable
from ..outbound.causes import OutboundError, as_http_error
from ..telemetry import metrics

# The proxy's logger, whichever of its modules writes: operators filter on this one name.
log = logging.getLogger("bcs_middleware.apps.proxy")


def unreachable(environ: dict[str, Any], upstream: env.Upstream, cause: OutboundError) -> BCSError:
    """The one place a cause becomes the client's answer: counted, logged, and the detail for superusers only.

    The status is :func:`~bcs_middleware.outbound.causes.as_http_error`'s (504 for a timeout,
    503 without an agent, else 502), the metric label the cause's own.
    """
    metrics.UPSTREAM_ERRORS.labels(metrics.upstream_label(upstream.name or "?"), cause.label).inc()
    exc = as_http_error(cause)
    if exc.status not in (502, 504):
        return exc  # no agent (503): its reason names the cluster, never an address
    log.warning("upstream %s unreachable (request %s): %s", upstream.name or "?",
                environ.get(env.REQUEST_ID, "-"), exc.message)
    cluster = env.get_cluster(environ)
    if cluster is not None and cluster.cluster_type == "k8s":
        return UpstreamUnreachable(exc, "cannot reach the cluster's apiserver")
    return UpstreamUnreachable(exc)
