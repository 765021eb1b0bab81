"""The dry-run review: what the admission chains would do to an object, without forwarding it.

``POST /rest/admission/review`` (:mod:`bcs_middleware.apps.admission_api`) calls :func:`review`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from ..core.environ import User
from ..core.errors import ValidationError
from .client import PUBLIC_FAILURE
from .definitions import K8sWebhook
from .matching import Operation, meta
from .outcome import AdmissionRejected, Outcome, Step
from .review import RequestAttributes


class Admitter(Protocol):
    """What a review drives (:class:`~.engine.AdmissionEngine`)."""

    def admit_bcs(self, operation: Literal["Create", "Update"], obj: Any, user: User | None, *,
                  dry_run: bool = False, trace: bool = False) -> Outcome: ...

    def admit_k8s(self, cluster_id: str, operation: Operation, attrs: RequestAttributes, obj: Any, old_obj: Any,
                  user: User | None, *, dry_run: bool = False, options: Mapping[str, Any] | None = None,
                  webhooks: Sequence[K8sWebhook] | None = None, trace: bool = False) -> Outcome: ...


def review(engine: Admitter, document: Any, user: User | None) -> dict[str, Any]:
    """Dry-run admission of ``document``; nothing is forwarded anywhere.

    ``{"operation": "CREATE"|"UPDATE"|"Create"|"Update", "object": {...},
    "oldObject"?, "cluster_id"? (Kubernetes definitions), "resource"?
    ("pods" or {"group","version","resource"}), "subResource"?, "namespace"?, "name"?,
    }`` → which webhooks ran, what each did, warnings, the final object,
    and whether the request would be allowed.

    A review is always a dry run: webhooks receive ``dryRun: true`` and, as
    kube-apiserver does, a webhook whose ``sideEffects`` is neither ``None`` nor
    ``NoneOnDryRun`` is never called — the review answers that it does not support
    dry run instead.
    """
    if not isinstance(document, dict):
        raise ValidationError("(body): must be a JSON object")
    operation = str(document.get("operation", "")).upper()
    if operation not in ("CREATE", "UPDATE"):
        raise ValidationError("operation: must be CREATE or UPDATE")
    obj = document.get("object")
    if not isinstance(obj, dict):
        raise ValidationError("object: must be a JSON object")
    cluster_id = document.get("cluster_id")
    try:
        if cluster_id is None:
            outcome = engine.admit_bcs(
                "Create" if operation == "CREATE" else "Update",
                obj,
                user,
                dry_run=True,
                trace=True,
            )
        else:
            attrs = _review_attributes(document, obj)
            outcome = engine.admit_k8s(
                str(cluster_id),
                "CREATE" if operation == "CREATE" else "UPDATE",
                attrs,
                obj,
                document.get("oldObject"),
                user,
                dry_run=True,
                trace=True,
            )
    except AdmissionRejected as rejected:
        return {
            "allowed": False,
            "status": {"code": rejected.status, "message": rejected.message},
            "webhooks": [_step_for(s, user) for s in rejected.steps],
            "final_object": None,
        }
    return {
        "allowed": True,
        "webhooks": [_step_for(s, user) for s in outcome.steps],
        "patched": outcome.patched,
        "warnings": list(outcome.warnings),
        "audit_annotations": dict(outcome.audit_annotations),
        "final_object": outcome.object,
    }


def _step_for(step: Step, user: User | None) -> dict[str, Any]:
    """A step as ``user`` may read it: why a call failed is for superusers (see :mod:`.client`)."""
    data = step.as_dict()
    if (step.outcome in ("skipped", "failed") and step.cause != "patch"
            and not (user is not None and user.is_superuser)):
        data["cause"], data["detail"] = "failed", PUBLIC_FAILURE
    return data


def _review_attributes(document: Mapping[str, Any], obj: Mapping[str, Any]) -> RequestAttributes:
    resource = document.get("resource")
    api_version = str(obj.get("apiVersion") or "v1")
    group, _, version = api_version.rpartition("/")
    if isinstance(resource, dict):
        group = str(resource.get("group", group))
        version = str(resource.get("version", version))
        resource = resource.get("resource")
    if not isinstance(resource, str) or not resource:
        raise ValidationError('resource: required for Kubernetes definitions (e.g. "pods")')
    namespace = document.get("namespace", meta(obj).get("namespace") or "")
    return RequestAttributes(
        group=group,
        version=version,
        resource=resource,
        subresource=str(document.get("subResource") or ""),
        name=str(document.get("name") or meta(obj).get("name") or ""),
        namespace=str(namespace),
    )
