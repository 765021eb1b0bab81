"""Every Prometheus metric the project exports, defined once.

Works under several gunicorn workers through ``prometheus_client``'s
multiprocess mode: when ``PROMETHEUS_MULTIPROC_DIR`` is set (``serve`` sets it),
each worker writes its samples there and ``/metrics`` aggregates them. The
source system's names are kept where they exist (``bcs_api_request_*``).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter(
    "bcs_api_request_count",
    "Requests handled, by route kind (rest, tunnel, mesos, other), cluster, method and code.",
    ["kind", "cluster", "method", "code"],
)
LATENCY = Histogram(
    "bcs_api_request_latency_seconds",
    "Time to the response headers, by route kind and method.",
    ["kind", "method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
UPSTREAM_ERRORS = Counter(
    "bcs_upstream_errors",
    "Upstream failures by upstream label and cause (connect, timeout, protocol).",
    ["upstream", "cause"],
)
OPEN_STREAMS = Gauge(
    "bcs_open_streams",
    "Responses being streamed from an upstream right now.",
    multiprocess_mode="livesum",
)
TOKEN_CACHE = Counter(
    "bcs_token_cache_lookups",
    "Token cache lookups by result (hit, miss).",
    ["result"],
)
WEBHOOK_CALLS = Counter(
    "bcs_admission_webhook_calls",
    "Admission webhook calls by webhook and outcome (allowed, denied, error).",
    ["webhook", "outcome"],
)
WEBHOOK_FAILURES = Counter(
    "bcs_admission_webhook_failures",
    "Admission webhook failures by webhook and cause (timeout, connect, tls, status, "
    "malformed, circuit_open, budget).",
    ["webhook", "cause"],
)
WEBHOOK_LATENCY = Histogram(
    "bcs_admission_webhook_latency_seconds",
    "Admission webhook call latency by webhook.",
    ["webhook"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
DISCOVERY_STALE = Gauge(
    "bcs_discovery_stale",
    "1 while service discovery cannot reach its source and serves the last snapshot.",
    multiprocess_mode="max",
)
OPEN_UPGRADES = Gauge(
    "bcs_open_upgraded_streams",
    "Upgraded connections (kubectl exec, attach, port-forward) being spliced right now.",
    multiprocess_mode="livesum",
)
UPGRADES = Counter(
    "bcs_upgrades",
    "Connection upgrade requests by outcome (spliced, refused by the upstream, error before "
    "an answer, unsupported by the server).",
    ["outcome"],
)
