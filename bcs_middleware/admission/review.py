"""The Kubernetes admission protocol: admission attributes, AdmissionReview in and out.

Responses are checked the way the kube-apiserver checks them
(``k8s.io/apiserver/pkg/admission/plugin/webhook/request``): the envelope's
apiVersion/kind match what was sent, the uid is the request's, ``patch`` and
``patchType`` come together and only as ``JSONPatch``, and a validating webhook
returns no patch at all.
"""

from __future__ import annotations

import base64
import binascii
import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonpatch
import jsonpointer

from ..core.bodies import parse_json
from ..core.environ import User
from ..core.errors import BadRequest
from ..core.paths import encode_path
from ..core.requestinfo import RequestInfo
from .webhook_failure import WebhookCallError

ADMISSION_GROUP = "admission.k8s.io"


@dataclass(frozen=True)
class RequestAttributes:
    """The admission attributes of a request: what a webhook's rules match and its review names."""

    group: str
    version: str
    resource: str
    subresource: str = ""
    name: str = ""
    namespace: str = ""

    @property
    def namespaced(self) -> bool:
        return bool(self.namespace) and self.resource != "namespaces"

    @property
    def api_path(self) -> str:
        """The object's own path (no subresource), percent-encoded, for reading it from the cluster."""
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        name = encode_path(self.name)
        if self.resource == "namespaces":
            return f"{prefix}/namespaces/{name}"
        scope = f"/namespaces/{encode_path(self.namespace)}" if self.namespace else ""
        return f"{prefix}{scope}/{encode_path(self.resource)}/{name}"


def admission_attributes(info: RequestInfo) -> RequestAttributes | None:
    """The admission attributes of a classified request; ``None`` when it is not admitted.

    The resource, subresource, name and namespace are the ``RequestInfo``'s, except that
    the deprecated ``/proxy/`` verb prefix is admitted as the ``proxy`` subresource it
    reaches (:mod:`bcs_middleware.core.requestinfo`).
    """
    if not info.is_resource or info.admission_operation is None:
        return None
    return RequestAttributes(
        group=info.api_group,
        version=info.api_version,
        resource=info.resource,
        subresource=info.connect_subresource if info.connect else info.subresource,
        name=info.name,
        namespace=info.namespace,
    )


def kind_of(obj: Mapping[str, Any] | None, attrs: RequestAttributes) -> dict[str, str]:
    api_version = str((obj or {}).get("apiVersion") or "")
    group, _, version = api_version.rpartition("/")
    return {
        "group": group if api_version else attrs.group,
        "version": version or attrs.version,
        "kind": str((obj or {}).get("kind") or ""),
    }


def user_info(user: User | None) -> dict[str, Any]:
    if user is None or user.anonymous:
        return {"username": "system:anonymous", "groups": ["system:unauthenticated"]}
    groups = list(dict.fromkeys([*user.groups, "system:authenticated"]))
    return {"username": user.name, "uid": str(user.id), "groups": groups}


def build_review(
    *,
    version: str,
    uid: str,
    operation: str,
    attrs: RequestAttributes,
    kind: Mapping[str, str],
    name: str,
    user: User | None,
    obj: Any,
    old_obj: Any,
    dry_run: bool,
    options: Mapping[str, Any] | None,
    request_attrs: RequestAttributes | None = None,
    request_kind: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """An AdmissionReview; ``attrs``/``kind`` as the webhook gets the object (its rule's version),
    ``request_attrs``/``request_kind`` as the request was made (``matchPolicy: Equivalent``)."""
    resource = {"group": attrs.group, "version": attrs.version, "resource": attrs.resource}
    asked = request_attrs or attrs
    request: dict[str, Any] = {
        "uid": uid,
        "kind": dict(kind),
        "resource": resource,
        "requestKind": dict(request_kind or kind),
        "requestResource": {"group": asked.group, "version": asked.version, "resource": asked.resource},
        "name": name,
        "namespace": attrs.namespace,
        "operation": operation,
        "userInfo": user_info(user),
        "object": obj,
        "oldObject": old_obj,
        "dryRun": dry_run,
        "options": dict(options) if options is not None else None,
    }
    if attrs.subresource:
        request["subResource"] = attrs.subresource
        request["requestSubResource"] = attrs.subresource
    return {
        "apiVersion": f"{ADMISSION_GROUP}/{version}",
        "kind": "AdmissionReview",
        "request": request,
    }


@dataclass(frozen=True)
class ReviewResponse:
    allowed: bool
    patch: tuple[dict[str, Any], ...] | None
    status: Mapping[str, Any]
    warnings: tuple[str, ...]
    audit_annotations: tuple[tuple[str, str], ...]


def parse_review_response(data: bytes, *, version: str, uid: str, mutating: bool) -> ReviewResponse:
    """Check a webhook's answer like the apiserver does; :class:`WebhookCallError` if not."""
    try:
        review = parse_json(data, what="answer")
    except BadRequest as exc:
        raise WebhookCallError("malformed", exc.message) from None
    if not isinstance(review, dict):
        raise WebhookCallError("malformed", "answer is not a JSON object")
    expected = f"{ADMISSION_GROUP}/{version}"
    if review.get("apiVersion") != expected or review.get("kind") != "AdmissionReview":
        raise WebhookCallError(
            "malformed",
            f"expected webhook response of {expected}, Kind=AdmissionReview, got "
            f"{_short(review.get('apiVersion'))}, Kind={_short(review.get('kind'))}",
        )
    response = review.get("response")
    if not isinstance(response, dict):
        raise WebhookCallError("malformed", "webhook response was absent")
    if response.get("uid") != uid:
        raise WebhookCallError(
            "malformed", f"expected response.uid={uid!r}, got {_short(response.get('uid'))}"
        )
    allowed = response.get("allowed")
    if not isinstance(allowed, bool):
        raise WebhookCallError("malformed", "response.allowed must be a boolean")
    raw_patch, patch_type = response.get("patch"), response.get("patchType")
    patch: tuple[dict[str, Any], ...] | None = None
    if not mutating:
        if raw_patch:
            raise WebhookCallError("malformed", "validating webhook may not return response.patch")
        if patch_type is not None:
            raise WebhookCallError(
                "malformed", "validating webhook may not return response.patchType"
            )
    elif raw_patch:
        if patch_type is None:
            raise WebhookCallError(
                "malformed", "webhook returned response.patch but not response.patchType"
            )
        if patch_type != "JSONPatch":
            raise WebhookCallError(
                "malformed", f"webhook returned invalid response.patchType of {_short(patch_type)}"
            )
        patch = decode_patch(raw_patch)
    elif patch_type is not None and version == "v1":
        raise WebhookCallError(
            "malformed", "webhook returned response.patchType but not response.patch"
        )
    status = response.get("status") if isinstance(response.get("status"), dict) else {}
    warnings = response.get("warnings") or []
    annotations = response.get("auditAnnotations") or {}
    if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
        raise WebhookCallError("malformed", "response.warnings must be a list of strings")
    if not isinstance(annotations, dict) or not all(
        isinstance(v, str) for v in annotations.values()
    ):
        raise WebhookCallError("malformed", "response.auditAnnotations must map strings to strings")
    return ReviewResponse(
        allowed, patch, status or {}, tuple(warnings), tuple(sorted(annotations.items()))
    )


def decode_patch(raw: Any) -> tuple[dict[str, Any], ...]:
    try:
        operations = parse_json(base64.b64decode(str(raw), validate=True), what="response.patch")
    except binascii.Error:
        raise WebhookCallError("malformed", "response.patch is not base64 JSON") from None
    except BadRequest as exc:
        raise WebhookCallError("malformed", exc.message) from None
    if not isinstance(operations, list) or not all(isinstance(op, dict) for op in operations):
        raise WebhookCallError("malformed", "response.patch is not a JSON Patch")
    return tuple(operations)


def apply_json_patch(obj: Any, operations: Any) -> Any:
    """RFC 6902 patch applied to a copy; :class:`ValueError` if it does not apply."""
    try:
        result = jsonpatch.JsonPatch(list(operations)).apply(obj)  # applied to a deep copy
    except (
        jsonpatch.JsonPatchException,
        jsonpointer.JsonPointerException,
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
    ) as exc:
        raise ValueError(f"patch does not apply: {type(exc).__name__}") from None
    return result


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


def _short(value: Any) -> str:
    return repr(value)[:80]
