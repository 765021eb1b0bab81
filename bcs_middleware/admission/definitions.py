"""Webhook definitions, parsed once into frozen values.

Two forms are accepted:

* the bcs form (``{"apiVersion": "v4", "kind": "admissionwebhook", ...}``) of the
  mesos-driver, matched by (operation, kind) of Mesos requests;
* the Kubernetes form (``admissionregistration.k8s.io/v1``
  ``MutatingWebhookConfiguration`` / ``ValidatingWebhookConfiguration``), registered
  per cluster and matched against tunnel requests by ``rules`` and label selectors.

Parsing validates the document against the shipped JSON Schema, then decodes
every ``caBundle`` and checks it is PEM holding at least one certificate, so a bad
definition is a 400 at registration time rather than a TLS failure on traffic.
The original document is kept (``document``) so a store can persist it verbatim.
"""

from __future__ import annotations

import base64
import binascii
import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from cryptography import x509

from ..core.errors import ValidationError
from ..core.schemas.validation import validate

FailurePolicy = Literal["Ignore", "Fail"]

BCS_SCHEMA = "bcs_admissionwebhook"
K8S_SCHEMA = "k8s_webhookconfiguration"
MUTATING = "MutatingWebhookConfiguration"
VALIDATING = "ValidatingWebhookConfiguration"
#: AdmissionReview versions this gateway can speak, in preference order.
REVIEW_VERSIONS = ("v1", "v1beta1")


@dataclass(frozen=True)
class ClientConfig:
    """Where a webhook is reached and what its certificate must chain to.

    Either ``url`` is set, or the service ``name``/``namespace`` are: the webhook
    is then ``https://{name}.{namespace}:{port}{path}`` and its certificate must
    be valid for ``{name}.{namespace}``.
    """

    ca_pem: str | None
    url: str | None = None
    service_name: str | None = None
    service_namespace: str | None = None
    path: str = "/"
    port: int = 443

    @property
    def service_host(self) -> str:
        return f"{self.service_name}.{self.service_namespace}"

    def describe(self) -> str:
        return self.url or f"https://{self.service_host}:{self.port}{self.path}"


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return self.key in labels and labels[self.key] in self.values
        return self.key not in labels or labels[self.key] not in self.values


@dataclass(frozen=True)
class LabelSelector:
    """A Kubernetes label selector; the empty selector matches everything."""

    match_labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            r.matches(labels) for r in self.expressions
        )

    @property
    def is_empty(self) -> bool:
        return not self.match_labels and not self.expressions


@dataclass(frozen=True)
class Rule:
    """One ``rules[]`` entry; ``*`` wildcards kept as they are written."""

    operations: frozenset[str]
    api_groups: frozenset[str]
    api_versions: frozenset[str]
    resources: tuple[str, ...]
    scope: Literal["*", "Cluster", "Namespaced"] = "*"

    def matches(
        self,
        operation: str,
        group: str,
        version: str,
        resource: str,
        subresource: str,
        namespaced: bool,
    ) -> bool:
        if "*" not in self.operations and operation not in self.operations:
            return False
        if "*" not in self.api_groups and group not in self.api_groups:
            return False
        if "*" not in self.api_versions and version not in self.api_versions:
            return False
        if (self.scope == "Cluster" and namespaced) or (
            self.scope == "Namespaced" and not namespaced
        ):
            return False
        return any(_resource_matches(pattern, resource, subresource) for pattern in self.resources)


def _resource_matches(pattern: str, resource: str, subresource: str) -> bool:
    # Same semantics as the apiserver's rule matcher: "*" is every resource but no
    # subresource, "*/*" everything, "pods/*" pods and its subresources, "*/status"
    # the status subresource of every resource.
    if pattern == "*/*":
        return True
    res, _, sub = pattern.partition("/")
    if res not in ("*", resource):
        return False
    if not _:
        return subresource == ""
    return sub == "*" or sub == subresource


@dataclass(frozen=True)
class BcsWebhook:
    """One entry of a bcs definition's ``admissionWebhooks``."""

    name: str
    failure_policy: FailurePolicy
    client: ClientConfig
    namespace_operator: Literal["In", "NotIn"] | None = None
    namespace_values: frozenset[str] = frozenset()
    review_versions: tuple[str, ...] = ()
    timeout: float | None = None

    @property
    def protocol(self) -> Literal["bcs", "kubernetes"]:
        return "kubernetes" if any(v in REVIEW_VERSIONS for v in self.review_versions) else "bcs"

    def selects_namespace(self, namespace: str) -> bool:
        if self.namespace_operator is None:
            return True
        inside = namespace in self.namespace_values
        return inside if self.namespace_operator == "In" else not inside


@dataclass(frozen=True)
class BcsDefinition:
    """A parsed bcs ``admissionwebhook``; unique per (``operation``, ``kind``)."""

    name: str
    namespace: str
    operation: Literal["Create", "Update"]
    kind: str  # lower case: matching is case-insensitive
    webhooks: tuple[BcsWebhook, ...]
    document: Mapping[str, Any] = field(compare=False, hash=False, repr=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.operation, self.kind)


@dataclass(frozen=True)
class K8sWebhook:
    """One ``webhooks[]`` entry of a Mutating/ValidatingWebhookConfiguration."""

    name: str
    configuration: str
    mutating: bool
    client: ClientConfig
    rules: tuple[Rule, ...]
    failure_policy: FailurePolicy = "Fail"
    namespace_selector: LabelSelector = LabelSelector()
    object_selector: LabelSelector = LabelSelector()
    side_effects: str = "None"
    timeout: float = 10.0
    review_versions: tuple[str, ...] = ("v1",)
    match_policy: Literal["Exact", "Equivalent"] = "Equivalent"

    @property
    def review_version(self) -> str:
        return next(v for v in self.review_versions if v in REVIEW_VERSIONS)


@dataclass(frozen=True)
class K8sConfiguration:
    """A parsed webhook configuration of one cluster."""

    name: str
    kind: Literal["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    webhooks: tuple[K8sWebhook, ...]
    document: Mapping[str, Any] = field(compare=False, hash=False, repr=False)

    @property
    def mutating(self) -> bool:
        return self.kind == MUTATING


def decode_ca_bundle(value: str, where: str) -> str:
    """base64 PEM → PEM text holding at least one certificate, else a 400 naming ``where``."""
    try:
        pem = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError(f"{where}: must be base64-encoded PEM") from None
    try:
        certificates = x509.load_pem_x509_certificates(pem)
    except ValueError:
        certificates = []
    if not certificates:
        raise ValidationError(f"{where}: does not hold a PEM certificate")
    return pem.decode("ascii")


def _refuse_userinfo(url: str, where: str) -> None:
    # A password in a definition would be shown to everyone who may read definitions and
    # sent in clear to logs; the apiserver refuses user information in webhook URLs too.
    if "@" in urlsplit(url).netloc:
        raise ValidationError(f"{where}: must not carry user information (user:password@)")


def parse_bcs_definition(document: Any, *, namespace: str | None = None) -> BcsDefinition:
    """Validate and parse a bcs definition; ``namespace`` overrides ``metadata.namespace``."""
    validate(BCS_SCHEMA, document)
    document = copy.deepcopy(document)
    meta = document["metadata"]
    if namespace is not None:
        meta["namespace"] = namespace
    webhooks = []
    seen: set[str] = set()
    for index, raw in enumerate(document["admissionWebhooks"]):
        where = f"admissionWebhooks.{index}"
        if raw["name"] in seen:
            raise ValidationError(f"{where}.name: duplicate webhook name")
        seen.add(raw["name"])
        cfg = raw["clientConfig"]
        if "url" not in cfg and not ("name" in cfg and "namespace" in cfg):
            raise ValidationError(
                f"{where}.clientConfig: 'name' and 'namespace' are required unless 'url' is given"
            )
        if "url" in cfg:
            _refuse_userinfo(cfg["url"], f"{where}.clientConfig.url")
        versions = tuple(raw.get("admissionReviewVersions", ()))
        if versions and not any(v in REVIEW_VERSIONS for v in versions):
            raise ValidationError(f"{where}.admissionReviewVersions: must include v1")
        selector = raw.get("namespaceSelector")
        webhooks.append(
            BcsWebhook(
                name=raw["name"],
                failure_policy=raw["failurePolicy"],
                client=ClientConfig(
                    ca_pem=decode_ca_bundle(cfg["caBundle"], f"{where}.clientConfig.caBundle"),
                    url=cfg.get("url"),
                    service_name=cfg.get("name"),
                    service_namespace=cfg.get("namespace"),
                    path=cfg.get("path", "/"),
                    port=cfg.get("port", 443),
                ),
                namespace_operator=selector["operator"] if selector else None,
                namespace_values=frozenset(selector["values"]) if selector else frozenset(),
                review_versions=versions,
                timeout=float(raw["timeoutSeconds"]) if "timeoutSeconds" in raw else None,
            )
        )
    return BcsDefinition(
        name=meta["name"],
        namespace=meta.get("namespace", ""),
        operation=document["resourcesRef"]["operation"],
        kind=document["resourcesRef"]["kind"].lower(),
        webhooks=tuple(webhooks),
        document=document,
    )


def _selector(raw: Mapping[str, Any] | None, where: str) -> LabelSelector:
    if not raw:
        return LabelSelector()
    expressions = []
    for index, expr in enumerate(raw.get("matchExpressions", ())):
        values = expr.get("values", [])
        has_values = expr["operator"] in ("In", "NotIn")
        if has_values and not values:
            raise ValidationError(
                f"{where}.matchExpressions.{index}.values: required for {expr['operator']}"
            )
        if not has_values and values:
            raise ValidationError(
                f"{where}.matchExpressions.{index}.values: must be empty for {expr['operator']}"
            )
        expressions.append(Requirement(expr["key"], expr["operator"], frozenset(values)))
    return LabelSelector(tuple(sorted(raw.get("matchLabels", {}).items())), tuple(expressions))


def parse_k8s_configuration(document: Any) -> K8sConfiguration:
    """Validate and parse a Mutating/ValidatingWebhookConfiguration (apiserver defaults applied)."""
    validate(K8S_SCHEMA, document)
    document = copy.deepcopy(document)
    name = document["metadata"]["name"]
    mutating = document["kind"] == MUTATING
    webhooks = []
    seen: set[str] = set()
    for index, raw in enumerate(document["webhooks"]):
        where = f"webhooks.{index}"
        if raw["name"] in seen:
            raise ValidationError(f"{where}.name: duplicate webhook name")
        seen.add(raw["name"])
        webhooks.append(_k8s_webhook(raw, where, configuration=name, mutating=mutating))
    return K8sConfiguration(
        name=name, kind=document["kind"], webhooks=tuple(webhooks), document=document
    )


def _k8s_webhook(raw: dict[str, Any], where: str, *, configuration: str, mutating: bool) -> K8sWebhook:
    """One entry of a configuration's ``webhooks``, checked as the apiserver's validation does."""
    if "reinvocationPolicy" in raw and not mutating:
        raise ValidationError(f"{where}.reinvocationPolicy: only for mutating webhooks")
    cfg = raw["clientConfig"]
    if ("url" in cfg) == ("service" in cfg):
        raise ValidationError(
            f"{where}.clientConfig: exactly one of 'url' or 'service' is required"
        )
    versions = tuple(raw["admissionReviewVersions"])
    if not any(v in REVIEW_VERSIONS for v in versions):
        raise ValidationError(f"{where}.admissionReviewVersions: must include v1 or v1beta1")
    if "url" in cfg:
        _refuse_userinfo(cfg["url"], f"{where}.clientConfig.url")
    service = cfg.get("service", {})
    ca = cfg.get("caBundle")
    rules = _k8s_rules(raw.get("rules", ()), where)
    return K8sWebhook(
        name=raw["name"],
        configuration=configuration,
        mutating=mutating,
        client=ClientConfig(
            ca_pem=decode_ca_bundle(ca, f"{where}.clientConfig.caBundle") if ca else None,
            url=cfg.get("url"),
            service_name=service.get("name"),
            service_namespace=service.get("namespace"),
            path=service.get("path", "/"),
            port=service.get("port", 443),
        ),
        rules=rules,
        failure_policy=raw.get("failurePolicy", "Fail"),
        namespace_selector=_selector(
            raw.get("namespaceSelector"), f"{where}.namespaceSelector"
        ),
        object_selector=_selector(raw.get("objectSelector"), f"{where}.objectSelector"),
        side_effects=raw["sideEffects"],
        timeout=float(raw.get("timeoutSeconds", 10)),
        review_versions=versions,
        match_policy=raw.get("matchPolicy", "Equivalent"),
    )


def _k8s_rules(raw_rules: Iterable[dict[str, Any]], where: str) -> tuple[Rule, ...]:
    rules = []
    for r_index, rule in enumerate(raw_rules):
        for key in ("operations", "apiGroups", "apiVersions", "resources"):
            if not rule.get(key):
                raise ValidationError(f"{where}.rules.{r_index}.{key}: required")
        rules.append(
            Rule(
                operations=frozenset(rule["operations"]),
                api_groups=frozenset(rule["apiGroups"]),
                api_versions=frozenset(rule["apiVersions"]),
                resources=tuple(rule["resources"]),
                scope=rule.get("scope", "*"),
            )
        )
    return tuple(rules)
