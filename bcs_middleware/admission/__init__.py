"""Admission interception: webhook definitions, the protocols, the engine, the CRUD API.

The WSGI layer lives in :mod:`bcs_middleware.middleware.admission`; everything it
needs is importable from here.
"""

from __future__ import annotations

from .api import AdmissionWebhookAPI
from .client import CircuitBreaker, Target, WebhookCallError, WebhookClient
from .definitions import (
    BcsDefinition,
    BcsWebhook,
    ClientConfig,
    K8sConfiguration,
    K8sWebhook,
    LabelSelector,
    Rule,
    parse_bcs_definition,
    parse_k8s_configuration,
)
from .engine import AdmissionEngine, AdmissionRejected, Outcome, Step, review
from .review import RequestAttributes, admission_attributes
from .store import ClusterReader, DefinitionStore, MemoryDefinitionStore, load_definitions_file

__all__ = [
    "AdmissionEngine",
    "AdmissionRejected",
    "AdmissionWebhookAPI",
    "BcsDefinition",
    "BcsWebhook",
    "CircuitBreaker",
    "ClientConfig",
    "ClusterReader",
    "DefinitionStore",
    "K8sConfiguration",
    "K8sWebhook",
    "LabelSelector",
    "MemoryDefinitionStore",
    "Outcome",
    "RequestAttributes",
    "Rule",
    "Step",
    "Target",
    "WebhookCallError",
    "WebhookClient",
    "admission_attributes",
    "load_definitions_file",
    "parse_bcs_definition",
    "parse_k8s_configuration",
    "review",
]
