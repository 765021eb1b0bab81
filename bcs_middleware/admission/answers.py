"""Checking what a webhook changed: a bcs answer, a Kubernetes JSON Patch, and that neither moves the object.

A change that does not apply to this request's object, or that would move the object (its
``apiVersion``, ``kind``, ``metadata.name`` or ``metadata.namespace``; for bcs webhooks its
kind, name or namespace), raises :class:`~.outcome.PatchRefused`: it fails the request
whatever the ``failurePolicy`` — as the kube-apiserver does — and is not the webhook's fault.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..core.bodies import parse_json
from ..core.errors import BadRequest
from .matching import meta
from .outcome import PatchRefused
from .review import RequestAttributes, apply_json_patch
from .webhook_failure import WebhookCallError


def bcs_answer(data: bytes, before: Mapping[str, Any]) -> dict[str, Any]:
    try:
        answer = parse_json(data, what="answer")
    except BadRequest as exc:
        raise WebhookCallError("malformed", exc.message) from None
    if not isinstance(answer, dict):
        raise WebhookCallError("malformed", "answer is not a JSON object")
    return answer


def refuse_bcs_move(before: Mapping[str, Any], answer: Mapping[str, Any]) -> None:
    if str(answer.get("kind", "")).lower() != str(before.get("kind", "")).lower():
        raise PatchRefused("may not change the object's kind", status=400,
                            code_name="ADMISSION_PATCH_REFUSED")
    for key in ("name", "namespace"):
        if meta(answer).get(key) != meta(before).get(key):
            raise PatchRefused(f"may not change metadata.{key}", status=400,
                                code_name="ADMISSION_PATCH_REFUSED")


def patched_object(obj: Any, patch: Sequence[Mapping[str, Any]], attrs: RequestAttributes) -> dict[str, Any]:
    """``obj`` with a webhook's patch applied; :class:`PatchRefused` if it does not apply or moves it."""
    if obj is None:
        # A DELETE has no object to patch (handlers' mutating dispatcher answers the same).
        raise PatchRefused("attempted to modify the object, which is not supported for this operation",
                            status=500, code_name="ADMISSION_PATCH_FAILED")
    try:
        patched = apply_json_patch(obj, patch)
    except ValueError as exc:
        raise PatchRefused(f"returned a patch that does not apply to the object: {exc}",
                            status=500, code_name="ADMISSION_PATCH_FAILED") from None
    if not isinstance(patched, dict):
        raise PatchRefused("returned a patch that makes the object something not a JSON object",
                            status=500, code_name="ADMISSION_PATCH_FAILED")
    # The object a request names may not be moved by a webhook (the kube-apiserver refuses
    # that too): another kind, name or namespace would escape what was authorized and matched.
    for where, before, after in (
        ("apiVersion", obj.get("apiVersion"), patched.get("apiVersion")),
        ("kind", obj.get("kind"), patched.get("kind")),
        ("metadata.name", meta(obj).get("name") or attrs.name, meta(patched).get("name") or attrs.name),
        ("metadata.namespace", meta(obj).get("namespace") or attrs.namespace,
         meta(patched).get("namespace") or attrs.namespace),
    ):
        if before != after:
            raise PatchRefused(f"may not change {where}", status=400, code_name="ADMISSION_PATCH_REFUSED")
    return patched
