"""Which Kubernetes webhooks a request meets: rules (with ``matchPolicy``), object and namespace selectors.

Pure decisions, as the kube-apiserver's webhook matchers take them
(``k8s.io/apiserver/pkg/admission/plugin/webhook/predicates``): :func:`webhook_attributes`
says whether a webhook's ``rules`` match and in which group/version it is sent the request;
:func:`selected` applies its ``objectSelector`` and ``namespaceSelector`` (the namespace's
labels come from the caller, which caches them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

from .definitions import K8sWebhook
from .equivalence import convertible, equivalents
from .review import RequestAttributes

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
#: The admission operations of Kubernetes webhooks (``admissionregistration.k8s.io/v1`` rules).
Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


def webhook_attributes(webhook: K8sWebhook, operation: str, attrs: RequestAttributes) -> RequestAttributes | None:
    """The request as ``webhook`` is sent it (its rule's group/version), ``None`` if no rule matches.

    ``matchPolicy: Exact`` matches the request's own group/version only; ``Equivalent``
    (the default) also an equivalent one (:mod:`.equivalence`): a built-in equivalent is
    sent converted to the rule's version, another version of the request's own group
    (custom resources) is sent as the request was made.
    """

    def hit(group: str, version: str) -> bool:
        return any(
            r.matches(operation, group, version, attrs.resource, attrs.subresource, attrs.namespaced)
            for r in webhook.rules
        )

    if hit(attrs.group, attrs.version):
        return attrs
    if webhook.match_policy != "Equivalent":
        return None
    for group, version in equivalents(attrs.group, attrs.version, attrs.resource):
        if hit(group, version):
            return dataclasses.replace(attrs, group=group, version=version)
    if any(hit(attrs.group, version) for rule in webhook.rules for version in rule.api_versions):
        return attrs
    return None


def selected(webhook: K8sWebhook, attrs: RequestAttributes, obj: Any, old_obj: Any,
             namespace_labels: Callable[[str], Mapping[str, str]]) -> bool:
    """Do ``webhook``'s selectors take this request? ``namespace_labels(namespace)`` is asked
    only when the namespace selector needs the request's namespace's labels."""
    selector = webhook.object_selector
    # The apiserver's object matcher: an object without metadata (the options of a
    # CONNECT) matches no objectSelector, not even one that empty labels would satisfy.
    if not selector.is_empty and not any(
        isinstance(o, dict) and isinstance(o.get("metadata"), dict) and selector.matches(labels_of(o))
        for o in (obj, old_obj)
    ):
        return False
    selector = webhook.namespace_selector
    if selector.is_empty:
        return True
    if attrs.resource == "namespaces":
        source = obj if obj is not None else old_obj
        labels = {
            **labels_of(source),
            NAMESPACE_NAME_LABEL: attrs.name or str(meta(source).get("name") or ""),
        }
        return selector.matches(labels)
    if not attrs.namespaced:
        return (
            True  # cluster-scoped objects are not in a namespace: the selector does not apply
        )
    return selector.matches(namespace_labels(attrs.namespace))


def in_version(obj: Any, attrs: RequestAttributes) -> Any:
    """``obj`` as the webhook's rule version names it, when the two are convertible (built-ins)."""
    if not isinstance(obj, dict) or "apiVersion" not in obj:
        return obj
    group, _, version = str(obj["apiVersion"]).rpartition("/")
    if not convertible(attrs.resource, group, version, attrs.group, attrs.version):
        return obj
    return {**obj, "apiVersion": f"{attrs.group}/{attrs.version}" if attrs.group else attrs.version}


def meta(obj: Any) -> Mapping[str, Any]:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return meta if isinstance(meta, dict) else {}


def labels_of(obj: Any) -> dict[str, str]:
    labels = meta(obj).get("labels")
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
