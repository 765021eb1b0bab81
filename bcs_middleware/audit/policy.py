"""An audit policy in the shape of Kubernetes' ``audit.k8s.io/v1`` ``Policy``.

The file (YAML or JSON) is what a kube-apiserver's ``--audit-policy-file`` takes, so
existing policies carry over::

    apiVersion: audit.k8s.io/v1
    kind: Policy
    omitStages: [RequestReceived]
    rules:
      - level: None
        nonResourceURLs: ["/version", "/healthz*"]
      - level: RequestResponse
        resources: [{group: "", resources: ["configmaps", "pods/exec"]}]
        verbs: [create, update, patch, delete]
      - level: Request
        users: [alice]
        namespaces: [prod]
        omitStages: [ResponseStarted]
      - level: Metadata

Rules are tried in order; the first that matches sets the level (and its
``omitStages`` add to the policy's). A request no rule matches is not audited, as
in Kubernetes. Matching follows the apiserver's ``policy.ruleMatches``: ``users``,
``userGroups``, ``verbs``, ``namespaces`` (``""`` is cluster scope), ``resources``
(``group`` + ``resources`` with ``*``, ``*/sub``, ``res/*``, ``resourceNames``) and
``nonResourceURLs`` (a trailing ``*`` is a prefix); a rule with ``resources`` or
``namespaces`` never matches a non-resource request, and one with
``nonResourceURLs`` never a resource request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..core.bodies import parse_yaml
from ..core.errors import ConfigError
from ..core.requestinfo import RequestInfo

Level = Literal["None", "Metadata", "Request", "RequestResponse"]
LEVELS: tuple[Level, ...] = ("None", "Metadata", "Request", "RequestResponse")
STAGES = ("RequestReceived", "ResponseStarted", "ResponseComplete", "Panic")


@dataclass(frozen=True)
class Attributes:
    """What a policy rule is matched against: the classified request and who made it."""

    info: RequestInfo
    user: str
    groups: tuple[str, ...]


@dataclass(frozen=True)
class GroupResources:
    group: str = ""
    resources: tuple[str, ...] = ()
    resource_names: tuple[str, ...] = ()

    def matches(self, info: RequestInfo) -> bool:
        if self.group != info.api_group:
            return False
        if not self.resources:
            return True
        if self.resource_names and info.name not in self.resource_names:
            return False
        combined = f"{info.resource}/{info.subresource}" if info.subresource else info.resource
        for res in self.resources:
            if res in ("*", combined):
                return True
            if info.subresource and res.startswith("*/") and res[2:] == info.subresource:
                return True
            if res.endswith("/*") and res[:-2] == info.resource:
                return True
        return False


@dataclass(frozen=True)
class Rule:
    level: Level
    users: tuple[str, ...] = ()
    user_groups: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ()
    resources: tuple[GroupResources, ...] = ()
    namespaces: tuple[str, ...] = ()
    non_resource_urls: tuple[str, ...] = ()
    omit_stages: tuple[str, ...] = ()

    def matches(self, attributes: Attributes) -> bool:
        info = attributes.info
        if self.users and attributes.user not in self.users:
            return False
        if self.user_groups and not set(self.user_groups) & set(attributes.groups):
            return False
        if self.verbs and info.verb not in self.verbs:
            return False
        if self.resources or self.namespaces:
            if not info.is_resource:
                return False
            if self.namespaces and info.namespace not in self.namespaces:
                return False
            if self.resources and not any(gr.matches(info) for gr in self.resources):
                return False
        if self.non_resource_urls:
            if info.is_resource:
                return False
            return any(info.path == url or (url.endswith("*") and info.path.startswith(url[:-1]))
                       for url in self.non_resource_urls)
        return True


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...]
    omit_stages: tuple[str, ...] = ()

    def decide(self, attributes: Attributes) -> tuple[Level, frozenset[str]]:
        """The level for a request and the stages not to write."""
        for rule in self.rules:
            if rule.matches(attributes):
                return rule.level, frozenset(self.omit_stages) | frozenset(rule.omit_stages)
        return "None", frozenset()


#: Without a policy file: every tunnel request at Metadata level, every stage.
DEFAULT_POLICY = Policy(rules=(Rule(level="Metadata"),))


def _strings(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
        raise ConfigError(f"audit policy {where}: must be a list of strings")
    return tuple(raw)


def _stages(raw: Any, where: str) -> tuple[str, ...]:
    stages = _strings(raw, where)
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise ConfigError(f"audit policy {where}: unknown stage {unknown[0]!r} (one of {', '.join(STAGES)})")
    return stages


_RULE_KEYS = {"level", "users", "userGroups", "verbs", "resources", "namespaces", "nonResourceURLs", "omitStages"}


def parse_policy(document: Any) -> Policy:
    """An ``audit.k8s.io/v1`` ``Policy`` document → :class:`Policy`; ConfigError names the field."""
    if not isinstance(document, Mapping):
        raise ConfigError("audit policy: must be a mapping (apiVersion: audit.k8s.io/v1, kind: Policy)")
    if document.get("kind", "Policy") != "Policy":
        raise ConfigError("audit policy: kind must be Policy")
    api_version = document.get("apiVersion", "audit.k8s.io/v1")
    if api_version not in ("audit.k8s.io/v1", "audit.k8s.io/v1beta1"):
        raise ConfigError(f"audit policy: apiVersion {api_version!r} is not audit.k8s.io/v1")
    raw_rules = document.get("rules")
    if not isinstance(raw_rules, list) or not raw_rules:
        raise ConfigError("audit policy rules: must be a non-empty list")
    rules = []
    for i, raw in enumerate(raw_rules):
        where = f"rules[{i}]"
        if not isinstance(raw, Mapping):
            raise ConfigError(f"audit policy {where}: must be a mapping")
        extra = set(raw) - _RULE_KEYS
        if extra:
            raise ConfigError(f"audit policy {where}: unknown field {sorted(extra)[0]!r}")
        level = raw.get("level")
        if level not in LEVELS:
            raise ConfigError(f"audit policy {where}.level: must be one of {', '.join(LEVELS)}")
        if raw.get("resources") and raw.get("nonResourceURLs"):
            raise ConfigError(f"audit policy {where}: resources and nonResourceURLs exclude each other")
        resources = []
        for j, gr in enumerate(raw.get("resources") or []):
            if not isinstance(gr, Mapping):
                raise ConfigError(f"audit policy {where}.resources[{j}]: must be a mapping")
            resources.append(GroupResources(
                group=str(gr.get("group", "")),
                resources=_strings(gr.get("resources"), f"{where}.resources[{j}].resources"),
                resource_names=_strings(gr.get("resourceNames"), f"{where}.resources[{j}].resourceNames"),
            ))
        rules.append(Rule(
            level=level,
            users=_strings(raw.get("users"), f"{where}.users"),
            user_groups=_strings(raw.get("userGroups"), f"{where}.userGroups"),
            verbs=_strings(raw.get("verbs"), f"{where}.verbs"),
            resources=tuple(resources),
            namespaces=_strings(raw.get("namespaces"), f"{where}.namespaces"),
            non_resource_urls=_strings(raw.get("nonResourceURLs"), f"{where}.nonResourceURLs"),
            omit_stages=_stages(raw.get("omitStages"), f"{where}.omitStages"),
        ))
    return Policy(rules=tuple(rules), omit_stages=_stages(document.get("omitStages"), "omitStages"))


def load_policy(path: str | Path) -> Policy:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"audit policy {path}: {exc.strerror}") from None
    try:
        document = parse_yaml(text, what=f"audit policy {path}")
    except Exception as exc:
        raise ConfigError(f"audit policy {path}: {exc}") from None
    return parse_policy(document)

