"""Kubernetes audit events for the tunnel: :mod:`.middleware` writes them, :mod:`.policy` decides."""

from __future__ import annotations

from .middleware import AuditEvent, AuditMiddleware, AuditSink
from .policy import DEFAULT_POLICY, Attributes, Policy, load_policy, parse_policy

__all__ = [
    "DEFAULT_POLICY",
    "Attributes",
    "AuditEvent",
    "AuditMiddleware",
    "AuditSink",
    "Policy",
    "load_policy",
    "parse_policy",
]
