"""Which group/versions serve the same resource, for ``matchPolicy: Equivalent``.

The kube-apiserver sends a request made through one version of a resource to a
webhook whose rules name another version of the same resource, converted to the
rule's version (``admissionregistration.k8s.io/v1`` defaults ``matchPolicy`` to
``Equivalent``). The gateway knows the built-in equivalences below — workloads
that moved from ``extensions``/``apps`` betas to ``apps/v1``, ingresses and
network policies that moved to ``networking.k8s.io`` and so on — whose objects
keep one schema across these versions, so converting is rewriting ``apiVersion``.

Other resources (custom resources above all) are equivalent across the versions
of their own group, as in the apiserver, but the gateway cannot convert them (that
takes the CRD's conversion): such a request is sent to the webhook in the version
it was made in, with ``kind``/``resource`` saying so, rather than not at all.
"""

from __future__ import annotations

_APPS_WORKLOADS = (("apps", "v1"), ("apps", "v1beta2"), ("extensions", "v1beta1"))

#: resource → the (group, version)s serving it, preferred first.
BUILT_IN: dict[str, tuple[tuple[str, str], ...]] = {
    "deployments": (*_APPS_WORKLOADS, ("apps", "v1beta1")),
    "daemonsets": _APPS_WORKLOADS,
    "replicasets": _APPS_WORKLOADS,
    "statefulsets": (("apps", "v1"), ("apps", "v1beta2"), ("apps", "v1beta1")),
    "controllerrevisions": (("apps", "v1"), ("apps", "v1beta2"), ("apps", "v1beta1")),
    "ingresses": (("networking.k8s.io", "v1"), ("networking.k8s.io", "v1beta1"), ("extensions", "v1beta1")),
    "networkpolicies": (("networking.k8s.io", "v1"), ("extensions", "v1beta1")),
    "podsecuritypolicies": (("policy", "v1beta1"), ("extensions", "v1beta1")),
    "cronjobs": (("batch", "v1"), ("batch", "v1beta1")),
    "poddisruptionbudgets": (("policy", "v1"), ("policy", "v1beta1")),
    "horizontalpodautoscalers": (
        ("autoscaling", "v2"), ("autoscaling", "v1"), ("autoscaling", "v2beta2"), ("autoscaling", "v2beta1"),
    ),
    "events": (("", "v1"), ("events.k8s.io", "v1"), ("events.k8s.io", "v1beta1")),
}


def convertible(resource: str, group: str, version: str, other_group: str, other_version: str) -> bool:
    """Whether an object of ``group/version`` converts to ``other_group/other_version`` by its apiVersion."""
    served = BUILT_IN.get(resource, ())
    return (group, version) in served and (other_group, other_version) in served


def equivalents(group: str, version: str, resource: str) -> tuple[tuple[str, str], ...]:
    """The other ``(group, version)``s a request for ``resource`` in ``group/version`` is equivalent to."""
    served = BUILT_IN.get(resource, ())
    if (group, version) in served:
        return tuple(gv for gv in served if gv != (group, version))
    return ()
