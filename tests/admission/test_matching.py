"""The engine's pure parts: which webhooks a request meets, and which changes a webhook may make.

These decide before any call; the protocol tests drive them through real webhooks and a real
gateway. Here each rule is tried on its edge, without a socket.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import trustme

from bcs_middleware.admission.answers import bcs_answer, patched_object, refuse_bcs_move
from bcs_middleware.admission.definitions import K8sWebhook, parse_k8s_configuration
from bcs_middleware.admission.matching import NAMESPACE_NAME_LABEL, selected, webhook_attributes
from bcs_middleware.admission.outcome import PatchRefused
from bcs_middleware.admission.review import RequestAttributes
from bcs_middleware.admission.webhook_failure import WebhookCallError

from .conftest import k8s_configuration, k8s_webhook

POD = RequestAttributes(group="", version="v1", resource="pods", namespace="team-a", name="web")


def _webhook(**extra: Any) -> K8sWebhook:
    document = k8s_configuration("c", [k8s_webhook("w.example.com", "hook.ns", trustme.CA(), **extra)])
    return parse_k8s_configuration(document).webhooks[0]


def _no_namespace_read(namespace: str) -> dict[str, str]:
    raise AssertionError(f"the labels of {namespace} were read")


@pytest.mark.parametrize(("operation", "attrs", "expected"), [
    pytest.param("CREATE", POD, POD, id="own-version"),
    pytest.param("UPDATE", POD, None, id="other-operation"),
    pytest.param("CREATE", RequestAttributes(group="", version="v1", resource="services", namespace="a"), None,
                 id="other-resource"),
])
def test_rules_decide_whether_and_how_a_webhook_is_sent_the_request(
        operation: str, attrs: RequestAttributes, expected: RequestAttributes | None) -> None:
    assert webhook_attributes(_webhook(), operation, attrs) == expected


def test_an_object_selector_matches_the_new_or_the_old_object() -> None:
    webhook = _webhook(objectSelector={"matchLabels": {"inject": "yes"}})
    tagged = {"metadata": {"labels": {"inject": "yes"}}}
    plain = {"metadata": {"labels": {}}}
    assert selected(webhook, POD, tagged, None, _no_namespace_read)
    assert selected(webhook, POD, plain, tagged, _no_namespace_read)
    assert not selected(webhook, POD, plain, plain, _no_namespace_read)
    # An object without metadata (a CONNECT's options) matches no object selector.
    assert not selected(_webhook(objectSelector={"matchExpressions": [
        {"key": "x", "operator": "DoesNotExist"}]}), POD, {"kind": "PodExecOptions"}, None, _no_namespace_read)


def test_a_namespace_selector_reads_the_namespace_labels_only_when_it_needs_them() -> None:
    webhook = _webhook(namespaceSelector={"matchLabels": {"env": "prod"}})
    asked: list[str] = []

    def labels(namespace: str) -> dict[str, str]:
        asked.append(namespace)
        return {"env": "prod"} if namespace == "team-a" else {}

    assert selected(webhook, POD, {"metadata": {}}, None, labels)
    assert not selected(webhook, RequestAttributes(group="", version="v1", resource="pods", namespace="team-b"),
                        {"metadata": {}}, None, labels)
    assert asked == ["team-a", "team-b"]
    # A namespace being created is matched on its own labels and name.
    ns = RequestAttributes(group="", version="v1", resource="namespaces", name="fresh")
    by_name = _webhook(namespaceSelector={"matchLabels": {NAMESPACE_NAME_LABEL: "fresh"}})
    assert selected(by_name, ns, {"metadata": {"name": "fresh"}}, None, _no_namespace_read)


@pytest.mark.parametrize(("patch", "refusal"), [
    pytest.param([{"op": "replace", "path": "/metadata/name", "value": "other"}], "metadata.name", id="rename"),
    pytest.param([{"op": "add", "path": "/metadata/namespace", "value": "kube-system"}], "metadata.namespace",
                 id="move-namespace"),
    pytest.param([{"op": "replace", "path": "/kind", "value": "Secret"}], "kind", id="change-kind"),
    pytest.param([{"op": "remove", "path": "/spec/missing"}], "does not apply", id="does-not-apply"),
])
def test_a_patch_that_moves_the_object_or_does_not_apply_is_refused(patch: list[dict[str, Any]],
                                                                    refusal: str) -> None:
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}, "spec": {}}
    with pytest.raises(PatchRefused, match=re.escape(refusal)):
        patched_object(obj, patch, POD)


def test_a_patch_that_keeps_the_object_in_place_applies() -> None:
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}, "spec": {}}
    patch = [{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]
    assert patched_object(obj, patch, POD)["metadata"]["labels"] == {"a": "b"}
    assert obj["metadata"] == {"name": "web"}  # the request's object is not changed in place


def test_a_bcs_answer_is_a_json_object_that_stays_where_it_was() -> None:
    before = {"kind": "Deployment", "metadata": {"name": "web", "namespace": "a"}}
    with pytest.raises(WebhookCallError) as info:
        bcs_answer(b"[1]", before)
    assert info.value.cause == "malformed"
    with pytest.raises(WebhookCallError):
        bcs_answer(b"{", before)
    answer = bcs_answer(b'{"kind": "deployment", "metadata": {"name": "web", "namespace": "a"}}', before)
    refuse_bcs_move(before, answer)  # the kind compares without case
    with pytest.raises(PatchRefused, match=r"metadata\.namespace"):
        refuse_bcs_move(before, {**answer, "metadata": {"name": "web", "namespace": "b"}})
