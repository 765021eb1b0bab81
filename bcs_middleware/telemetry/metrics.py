"""Every Prometheus metric the project exports, defined once.

Works under several gunicorn workers through ``prometheus_client``'s
multiprocess mode: when ``PROMETHEUS_MULTIPROC_DIR`` is set (``serve`` sets it),
each worker writes its samples there and ``/metrics`` aggregates them. The
source system's names are kept where they exist (``bcs_api_request_*``).
"""

from __future__ import annotations

import bisect
import threading
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from ..core.printable import escape
from .batching import BatchQueue

REQUESTS = Counter(
    "bcs_api_request_count",
    "Requests handled, by route kind (rest, tunnel, mesos, agent, other), cluster (empty when none "
    "was routed to), method (other for an unknown one) and code.",
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
    "Upstream failures by upstream label and cause (connect, timeout, tls, malformed, broken, agent).",
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
STREAMS_DEPARTED = Counter(
    "bcs_streams_departed",
    "Streamed responses ended because their client left while the upstream was quiet.",
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
RECORDINGS = Counter(
    "bcs_session_recordings",
    "exec/attach sessions by what happened to their recording (recorded, failed, refused: "
    "the policy required a recording that could not be written; interrupted: its writer died).",
    ["outcome"],
)
RECORDING_FAILURES = Counter(
    "bcs_recording_failures",
    "Recordings that could not be written, by stage (create, write, stall, finish).",
    ["stage"],
)

AGENTS_CONNECTED = Gauge(
    "bcs_agent_tunnels_connected",
    "kube-agent tunnels connected to this gateway right now.",
    multiprocess_mode="livesum",
)
AGENT_CONNECTIONS = Counter(
    "bcs_agent_tunnel_connections",
    "kube-agent tunnel connections accepted, by cluster.",
    ["cluster"],
)
AGENT_RECONNECTS = Counter(
    "bcs_agent_tunnel_reconnects",
    "kube-agent tunnel connections for a cluster whose agent was connected before (after a drop, "
    "or replacing a connection still held), by cluster.",
    ["cluster"],
)
AGENT_STREAMS = Gauge(
    "bcs_agent_tunnel_streams",
    "Streams open over a cluster's kube-agent tunnel (refreshed every few seconds).",
    ["cluster"],
    multiprocess_mode="livesum",
)
AGENT_DIALS = Counter(
    "bcs_agent_tunnel_dials",
    "Streams asked of kube-agent tunnels, by route (local: this process holds the agent; "
    "forwarded: through the peer link to the process that does; none: nobody usable holds it) "
    "and outcome (ok, unavailable).",
    ["route", "outcome"],
)
AGENT_BYTES = Counter(
    "bcs_agent_tunnel_bytes",
    "Bytes carried over a cluster's kube-agent tunnel, by direction (in: from the agent).",
    ["cluster", "direction"],
)
AGENT_LIMIT_CLOSES = Counter(
    "bcs_agent_tunnel_limit_closes",
    "kube-agent tunnel connections cut because the agent broke a bound or a rule of the protocol, by "
    "cluster and bound (pongs, send_queue, message_size, fragments, unknown_stream, connect, protocol).",
    ["cluster", "bound"],
)

# Per-user limits (bcs_middleware/layers/limits.py). ``limit`` is a closed set (user_rate,
# user_inflight, user_long_running, group_inflight, cluster_inflight, cluster_long_running,
# worker_seats, user_queue): never a user's, group's or cluster's name.
LIMIT_ADMITTED = Counter(
    "bcs_limits_admitted",
    "Requests the per-user limits let through, by kind (ordinary, long_running) and whether they waited (queued).",
    ["kind", "queued"],
)
LIMIT_QUEUED = Counter(
    "bcs_limits_queued",
    "Requests that waited in their user's line, by the limit that held them.",
    ["limit"],
)
LIMIT_REFUSED = Counter(
    "bcs_limits_refused",
    "Requests answered 429 by the per-user limits, by the limit that refused them.",
    ["limit"],
)
LIMIT_QUEUE_WAIT = Histogram(
    "bcs_limits_queue_wait_seconds",
    "Time requests waited in their user's line (admitted or not), by the limit that held them.",
    ["limit"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
LIMIT_WAITING = Gauge(
    "bcs_limits_waiting",
    "Requests waiting in users' lines right now.",
    multiprocess_mode="livesum",
)
LIMIT_CAPACITY = Gauge(
    "bcs_limits_capacity",
    "Configured bounds of the gateway and its own clients, by bound (0: none). Per worker for "
    "worker_seats and the outbound and database pools; per instance for the others.",
    ["bound"],
    multiprocess_mode="max",
)
LIMIT_TABLE_OVERFLOWS = Counter(
    "bcs_limits_table_overflows",
    "Requests admitted uncounted because the shared limits table had no slot for their key.",
)
DISCOVERY_CACHE = Counter(
    "bcs_discovery_cache_lookups",
    "Discovery and OpenAPI documents asked of the per-cluster cache, by result (hit, miss, "
    "revalidated, refetched, invalidated, uncacheable).",
    ["result"],
)
# Audit export (bcs_middleware/audit/export/): labels are the backend (webhook, syslog) and,
# for drops, a fixed reason — never configuration or anything from an event.
AUDIT_SENT = Counter(
    "bcs_audit_events_sent",
    "Audit events the backend's receiver accepted, by backend.",
    ["backend"],
)
AUDIT_RETRIED = Counter(
    "bcs_audit_events_retried",
    "Audit events whose delivery failed and will be tried again from the spool, by backend.",
    ["backend"],
)
AUDIT_SPOOLED = Counter(
    "bcs_audit_events_spooled",
    "Audit events written to the backend's durable spool, by backend.",
    ["backend"],
)
AUDIT_DROPPED = Counter(
    "bcs_audit_events_dropped",
    "Audit events not delivered, by backend and reason (buffer_full: the in-memory buffer before "
    "the spool; spool_full: the spool at its size bound; rejected: over the event size even truncated, or "
    "refused by the receiver for good; damaged: cut short by a crash while spooled).",
    ["backend", "reason"],
)
AUDIT_SPOOL_BYTES = Gauge(
    "bcs_audit_spool_bytes",
    "Bytes in the audit spools' segment files, by backend.",
    ["backend"],
    multiprocess_mode="livesum",
)

# The item MetricBatch.request queues: both per-request metrics for one ``put``.
_REQUEST = object()

# Label values a client chooses are mapped onto a fixed set: every distinct value
# is a new time series (one counter and a whole histogram), kept for the process's
# life, and a client needs no token to invent methods.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"})
_CODES = frozenset(str(code) for code in range(100, 600))
OTHER = "other"


def method_label(method: str) -> str:
    """``method`` when it is a standard HTTP method, else ``"other"``."""
    return method if method in _METHODS else OTHER


def code_label(code: str) -> str:
    """A status code ``100``..``599``, else ``"other"`` (an upstream's status is relayed as is)."""
    return code if code in _CODES else OTHER


class BoundedValues:
    """At most ``limit`` distinct values of one label in a process; later new ones read ``other``.

    Cluster ids, webhook names and upstream names come from records, not from the
    request, but users make those records: any user may register clusters, and a
    cluster's ``edit`` holders define its webhooks. Without a cap each new name
    would add series for the life of the process. The cap is far above what a
    real installation names (the values seen first keep their own series).
    """

    def __init__(self, limit: int = 2000) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        value = escape(value)  # a label is text a scraper shows: no control character in it
        with self._lock:
            if len(self._seen) < self.limit:
                self._seen.add(value)
                return value
        return OTHER


#: Bounds for the label values records name: clusters, webhooks and upstreams.
cluster_label = BoundedValues()
webhook_label = BoundedValues()
upstream_label = BoundedValues()


class MetricBatch:
    """Per-request metric updates, applied to ``prometheus_client`` a few times a second.

    Under ``PROMETHEUS_MULTIPROC_DIR`` every ``inc``/``observe`` takes a process-wide
    lock, calls ``getpid()`` and writes to an mmap: about 5 µs for the three updates of
    a proxied request, measured in one thread, and several times that under gunicorn's
    threads. Request threads only put a tuple on a
    :class:`~bcs_middleware.telemetry.batching.BatchQueue` (~0.1 µs); its thread applies what has
    queued up every ``period`` seconds, as one ``inc(n)`` per counter child and one
    update per histogram bucket touched.

    ``flush()`` applies everything now: ``/metrics`` calls it for its own process, so
    what that worker counted is current; another worker's updates show within
    ``period``. Whatever is queued is applied at exit. Fork-safe: a child starts empty
    and starts its own thread on first use.
    """

    def __init__(self, *, period: float = 0.25) -> None:
        self._queue = BatchQueue(_apply, period=period, name="bcs-metrics")

    def inc(self, metric: Any, *labels: str) -> None:
        """``metric.labels(*labels).inc()``, deferred."""
        self._queue.put((metric, labels, None))

    def observe(self, metric: Any, value: float, *labels: str) -> None:
        """``metric.labels(*labels).observe(value)``, deferred (a Histogram)."""
        self._queue.put((metric, labels, value))

    def request(self, kind: str, cluster: str, method: str, code: str, seconds: float) -> None:
        """One request: :data:`REQUESTS` ``+1`` and :data:`LATENCY` ``seconds``, in one item.

        ``method`` and ``code`` may be anything a client or upstream sent: they are
        bounded (:func:`method_label`, :func:`code_label`) when applied, off the
        request's thread. ``kind`` must already be bounded (a route kind) and
        ``cluster`` be a cluster the store or discovery knows, else ``""`` (its
        distinct values are capped by :data:`cluster_label`).
        """
        self._queue.put((_REQUEST, (kind, cluster, method, code), seconds))

    def flush(self) -> None:
        """Apply every update queued so far."""
        self._queue.drain()


def _apply(updates: list[tuple[Any, tuple[str, ...], float | None]]) -> None:
    counts: dict[tuple[Any, tuple[str, ...]], int] = {}
    observed: dict[tuple[Any, tuple[str, ...]], list[float]] = {}
    for metric, labels, value in updates:
        if metric is _REQUEST:
            kind, cluster, method, code = labels
            labels = (kind, cluster_label(cluster), method_label(method), code_label(code))
            counts[REQUESTS, labels] = counts.get((REQUESTS, labels), 0) + 1
            observed.setdefault((LATENCY, (labels[0], labels[2])), []).append(value)  # type: ignore[arg-type]
        elif value is None:
            counts[metric, labels] = counts.get((metric, labels), 0) + 1
        else:
            observed.setdefault((metric, labels), []).append(value)
    for (metric, labels), count in counts.items():
        (metric.labels(*labels) if labels else metric).inc(count)
    for (metric, labels), values in observed.items():
        _observe_all(metric.labels(*labels) if labels else metric, values)


def _observe_all(histogram: Any, values: list[float]) -> None:
    """``observe`` each value, with one write per bucket touched rather than two per value.

    Uses the Histogram's ``_upper_bounds``/``_buckets``/``_sum`` (stable across
    prometheus_client releases for years); anything else gets plain ``observe`` calls.
    """
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for value in values:
            histogram.observe(value)
        return
    hits = [0] * len(bounds)
    for value in values:
        # The first bucket whose upper bound holds the value, as observe() picks it.
        hits[bisect.bisect_left(bounds, value)] += 1
    total.inc(sum(values))
    for index, count in enumerate(hits):
        if count:
            buckets[index].inc(count)


#: The batch the request path records into.
BATCH = MetricBatch()
