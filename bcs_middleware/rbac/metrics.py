"""The RBAC reconciler's Prometheus metrics (defined once, like ``bcs_middleware.telemetry.metrics``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

RBAC_OPERATIONS = Counter(
    "bcs_rbac_operations",
    "Bindings the RBAC reconciler created, updated, deleted or failed on, by cluster.",
    ["cluster", "operation"],
)
RBAC_RUNS = Counter(
    "bcs_rbac_runs",
    "RBAC reconcile passes by cluster and result (ok, partial, error).",
    ["cluster", "result"],
)
RBAC_SOURCE_REJECTED = Counter(
    "bcs_rbac_source_rejected",
    "Permission data rejected (fetch failed or invalid); the previous grants stay in force.",
    ["cause"],
)
RBAC_LEADER = Gauge(
    "bcs_rbac_leader",
    "1 in the process that holds the RBAC reconciler lease.",
    multiprocess_mode="max",
)
