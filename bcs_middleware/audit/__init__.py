"""Kubernetes audit events for the tunnel: :mod:`.middleware` writes them, :mod:`.policy` decides."""

from __future__ import annotations

from .middleware import AuditEvent, AuditMiddleware, AuditSink, request_info
from .policy import DEFAULT_POLICY, Policy, RequestInfo, load_policy, parse_policy

__all__ = [
    "DEFAULT_POLICY",
    "AuditEvent",
    "AuditMiddleware",
    "AuditSink",
    "Policy",
    "RequestInfo",
    "load_policy",
    "parse_policy",
    "request_info",
]
