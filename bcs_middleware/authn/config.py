"""kube-apiserver's structured ``AuthenticationConfiguration``: parsed, validated, frozen.

The file is the one kube-apiserver ≥ 1.30 takes with ``--authentication-config``
(``apiserver.config.k8s.io`` ``v1alpha1``, ``v1beta1`` or ``v1``; its ``jwt`` list and
``anonymous``, :mod:`.anonymous`). Decoding is strict as the apiserver's is: an unknown field is an
error. The rules are those of
``staging/src/k8s.io/apiserver/pkg/apis/apiserver/validation/validation.go``
(``validateJWTAuthenticator``): at most 64 authenticators, issuer and discovery URLs
``https`` without credentials, query or fragment and unique, at least one audience
(several need ``audienceMatchPolicy: MatchAny``), claim rules either ``claim`` or
``expression``, a ``prefix`` required with a mapped ``claim`` (``""`` disables it) and
forbidden with an ``expression``, extra keys domain-prefixed, lower case and outside
``k8s.io``/``kubernetes.io``, and ``claims.email_verified`` used somewhere when the
username expression reads ``claims.email``. Every error names its field path, as the
apiserver's ``field.ErrorList`` does, and the whole list is reported at once.

Expressions are compiled here (:mod:`.cel`), so a configuration that loads never meets
a syntax error on the request path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from ..core.errors import ConfigError
from .anonymous import AnonymousAuth
from .cel import CompiledExpression, Returns, compile_expression, selects

__all__ = [
    "AuthenticationConfiguration",
    "ClaimValidationRule",
    "ExtraMapping",
    "Issuer",
    "JWTAuthenticator",
    "Mapping_",
    "UserValidationRule",
    "load_configuration",
    "parse_configuration",
]

API_GROUP = "apiserver.config.k8s.io"
VERSIONS = ("v1alpha1", "v1beta1", "v1")
#: validation.go: ``len(c.JWT) > 64`` is TooMany.
MAX_AUTHENTICATORS = 64
#: A path segment of a domain-prefixed extra key (utilvalidation.IsDomainPrefixedPath).
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class Issuer:
    url: str
    audiences: tuple[str, ...]
    discovery_url: str = ""
    audience_match_policy: str = ""
    certificate_authority: str = ""


@dataclass(frozen=True)
class ClaimValidationRule:
    claim: str = ""
    required_value: str = ""
    expression: CompiledExpression | None = None
    message: str = ""


@dataclass(frozen=True)
class Mapping_:
    """A ``PrefixedClaimOrExpression`` (username, groups) or ``ClaimOrExpression`` (uid).

    ``prefix`` is ``None`` when the field was absent (only legal with an expression).
    """

    claim: str = ""
    prefix: str | None = None
    expression: CompiledExpression | None = None

    @property
    def configured(self) -> bool:
        return bool(self.claim) or self.expression is not None


@dataclass(frozen=True)
class ExtraMapping:
    key: str
    value_expression: CompiledExpression


@dataclass(frozen=True)
class UserValidationRule:
    expression: CompiledExpression
    message: str = ""


@dataclass(frozen=True)
class JWTAuthenticator:
    issuer: Issuer
    username: Mapping_
    groups: Mapping_ = Mapping_()
    uid: Mapping_ = Mapping_()
    extra: tuple[ExtraMapping, ...] = ()
    claim_validation_rules: tuple[ClaimValidationRule, ...] = ()
    user_validation_rules: tuple[UserValidationRule, ...] = ()


@dataclass(frozen=True)
class AuthenticationConfiguration:
    """:param anonymous: the file's ``anonymous``; ``None`` when the file has none (requests
        without credentials are refused, unless the token auth filter's ``required`` says otherwise)."""

    jwt: tuple[JWTAuthenticator, ...] = ()
    anonymous: AnonymousAuth | None = None


def load_configuration(path: str | Path) -> AuthenticationConfiguration:
    """Read and validate the file; :class:`ConfigError` lists every problem with its field path."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"authentication config {path}: {exc.strerror}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"authentication config {path}: not YAML or JSON: {exc}") from None
    return parse_configuration(document, source=str(path))


def parse_configuration(document: Any, *, source: str = "authentication config") -> AuthenticationConfiguration:
    errors = _Errors()
    if not isinstance(document, dict):
        raise ConfigError(f"{source}: expected a mapping (an AuthenticationConfiguration)")
    _only(errors, "", document, {"apiVersion", "kind", "jwt", "anonymous", "authorization"})
    group, _, version = str(document.get("apiVersion", "")).partition("/")
    if group != API_GROUP or version not in VERSIONS:
        errors.add("apiVersion", f"must be {API_GROUP}/{{{','.join(VERSIONS)}}}")
    if document.get("kind") != "AuthenticationConfiguration":
        errors.add("kind", "must be AuthenticationConfiguration")
    anonymous = _anonymous(errors, document.get("anonymous"))
    items = document.get("jwt") or []
    authenticators: list[JWTAuthenticator] = []
    if not isinstance(items, list):
        errors.add("jwt", "must be a list")
    elif len(items) > MAX_AUTHENTICATORS:
        errors.add("jwt", f"must have at most {MAX_AUTHENTICATORS} items")
    else:
        seen_issuers: set[str] = set()
        seen_discovery: set[str] = set()
        for index, item in enumerate(items):
            found = _jwt_authenticator(errors, f"jwt[{index}]", item)
            if found is None:
                continue
            if found.issuer.url in seen_issuers:
                errors.add(f"jwt[{index}].issuer.url", f"Duplicate value: {found.issuer.url!r}")
            seen_issuers.add(found.issuer.url)
            if found.issuer.discovery_url:
                if found.issuer.discovery_url in seen_discovery:
                    errors.add(f"jwt[{index}].issuer.discoveryURL",
                               f"Duplicate value: {found.issuer.discovery_url!r}")
                seen_discovery.add(found.issuer.discovery_url)
            authenticators.append(found)
    errors.raise_if_any(source)
    return AuthenticationConfiguration(tuple(authenticators), anonymous)


class _Errors:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(f"{path}: {message}" if path else message)

    def raise_if_any(self, source: str) -> None:
        if self.items:
            raise ConfigError(f"{source}: " + "; ".join(self.items))


def _only(errors: _Errors, path: str, value: Mapping[str, Any], known: set[str]) -> None:
    for key in value:
        if key not in known:
            errors.add(f"{path}.{key}" if path else str(key), "unknown field")


def _mapping(errors: _Errors, path: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        errors.add(path, "must be a mapping")
        return {}
    return value


def _string(errors: _Errors, path: str, value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        errors.add(path, "must be a string")
        return ""
    return value


def _anonymous(errors: _Errors, value: Any) -> AnonymousAuth | None:
    """``anonymous: {enabled, conditions: [{path}]}`` (types.go ``AnonymousAuthConfig``)."""
    if value is None:
        return None
    raw = _mapping(errors, "anonymous", value)
    _only(errors, "anonymous", raw, {"enabled", "conditions"})
    enabled = raw.get("enabled", False)
    if not isinstance(enabled, bool):
        errors.add("anonymous.enabled", "must be a boolean")
        enabled = False
    conditions = raw.get("conditions") or []
    if not isinstance(conditions, list):
        errors.add("anonymous.conditions", "must be a list")
        conditions = []
    if conditions and not enabled:
        # validation.go's words, so a file kube-apiserver refuses is refused the same way.
        errors.add("anonymous.conditions", "Invalid value: enabled should be set to true when conditions are defined")
    paths: set[str] = set()
    for index, item in enumerate(conditions):
        at = f"anonymous.conditions[{index}]"
        condition = _mapping(errors, at, item)
        _only(errors, at, condition, {"path"})
        path = _string(errors, f"{at}.path", condition.get("path"))
        # kube-apiserver takes any string and compares it with the request's path; one not
        # starting with "/" can never match, so it is a mistake worth saying at start.
        if not path.startswith("/"):
            errors.add(f"{at}.path", f"Invalid value: {path!r}: must be an absolute path (matched exactly)")
        paths.add(path)
    return AnonymousAuth(enabled, frozenset(paths))


def _jwt_authenticator(errors: _Errors, path: str, item: Any) -> JWTAuthenticator | None:
    before = len(errors.items)
    item = _mapping(errors, path, item)
    _only(errors, path, item, {"issuer", "claimValidationRules", "claimMappings", "userValidationRules"})
    issuer = _issuer(errors, f"{path}.issuer", _mapping(errors, f"{path}.issuer", item.get("issuer")))
    state = _EmailUse()
    rules = _claim_validation_rules(errors, f"{path}.claimValidationRules", item.get("claimValidationRules"), state)
    mappings = _mapping(errors, f"{path}.claimMappings", item.get("claimMappings"))
    _only(errors, f"{path}.claimMappings", mappings, {"username", "groups", "uid", "extra"})
    username = _prefixed(errors, f"{path}.claimMappings.username", mappings.get("username"), required=True)
    groups = _prefixed(errors, f"{path}.claimMappings.groups", mappings.get("groups"), required=False)
    uid = _claim_or_expression(errors, f"{path}.claimMappings.uid", mappings.get("uid"))
    extra = _extra(errors, f"{path}.claimMappings.extra", mappings.get("extra"), state)
    user_rules = _user_validation_rules(errors, f"{path}.userValidationRules", item.get("userValidationRules"))
    if username.expression is not None:
        state.email = state.email or selects(username.expression, "claims", "email")
        state.email_verified = state.email_verified or selects(username.expression, "claims", "email_verified")
    if state.email and not state.email_verified:
        errors.add(f"{path}.claimMappings.username.expression",
                   "claims.email_verified must be used in claimMappings.username.expression or "
                   "claimMappings.extra[*].valueExpression or claimValidationRules[*].expression when "
                   "claims.email is used in claimMappings.username.expression")
    if len(errors.items) > before:
        return None
    return JWTAuthenticator(issuer, username, groups, uid, extra, rules, user_rules)


class _EmailUse:
    def __init__(self) -> None:
        self.email = False
        self.email_verified = False


def _issuer(errors: _Errors, path: str, value: dict[str, Any]) -> Issuer:
    _only(errors, path, value, {"url", "discoveryURL", "audiences", "audienceMatchPolicy",
                                "certificateAuthority", "egressSelectorType"})
    url = _string(errors, f"{path}.url", value.get("url"))
    if not url:
        errors.add(f"{path}.url", "Required value")
    else:
        _url(errors, f"{path}.url", url)
    discovery = _string(errors, f"{path}.discoveryURL", value.get("discoveryURL"))
    if discovery:
        if url and url.rstrip("/") == discovery.rstrip("/"):
            errors.add(f"{path}.discoveryURL", "discoveryURL must be different from URL")
        _url(errors, f"{path}.discoveryURL", discovery)
    audiences = value.get("audiences") or []
    policy = _string(errors, f"{path}.audienceMatchPolicy", value.get("audienceMatchPolicy"))
    if not isinstance(audiences, list) or not audiences:
        errors.add(f"{path}.audiences", f"Required value: at least one {path}.audiences is required")
        audiences = []
    seen: set[str] = set()
    for index, audience in enumerate(audiences):
        if not isinstance(audience, str) or not audience:
            errors.add(f"{path}.audiences[{index}]", "Required value")
        elif audience in seen:
            errors.add(f"{path}.audiences[{index}]", f"Duplicate value: {audience!r}")
        else:
            seen.add(audience)
    if len(audiences) > 1 and policy != "MatchAny":
        errors.add(f"{path}.audienceMatchPolicy", "audienceMatchPolicy must be MatchAny for multiple audiences")
    if len(audiences) == 1 and policy not in ("", "MatchAny"):
        errors.add(f"{path}.audienceMatchPolicy",
                   "audienceMatchPolicy must be empty or MatchAny for single audience")
    ca = _string(errors, f"{path}.certificateAuthority", value.get("certificateAuthority"))
    if ca and "-----BEGIN CERTIFICATE-----" not in ca:
        errors.add(f"{path}.certificateAuthority",
                   "<omitted>: data does not contain any valid RSA or ECDSA certificates")
    if value.get("egressSelectorType"):
        errors.add(f"{path}.egressSelectorType", "not supported by the gateway (its outbound stack is used)")
    return Issuer(url, tuple(a for a in audiences if isinstance(a, str)), discovery, policy, ca)


def _url(errors: _Errors, path: str, url: str) -> None:
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        errors.add(path, f"Invalid value: {url!r}: {exc}")
        return
    if parts.scheme != "https":
        errors.add(path, f"Invalid value: {url!r}: URL scheme must be https")
    if parts.username is not None or parts.password is not None:
        errors.add(path, "URL must not contain a username or password")
    if parts.query:
        errors.add(path, f"Invalid value: {url!r}: URL must not contain a query")
    if parts.fragment:
        errors.add(path, f"Invalid value: {url!r}: URL must not contain a fragment")


def _compile(errors: _Errors, path: str, source: Any, variable: str,
             returns: Returns = "any") -> CompiledExpression | None:
    text = _string(errors, path, source)
    try:
        return compile_expression(text, variable, returns)
    except ValueError as exc:
        errors.add(path, f"Invalid value: {text!r}: compilation failed: {exc}")
        return None


def _claim_validation_rules(errors: _Errors, path: str, value: Any,
                            state: _EmailUse) -> tuple[ClaimValidationRule, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        errors.add(path, "must be a list")
        return ()
    rules: list[ClaimValidationRule] = []
    seen_claims: set[str] = set()
    seen_expressions: set[str] = set()
    for index, raw in enumerate(value):
        at = f"{path}[{index}]"
        rule = _mapping(errors, at, raw)
        _only(errors, at, rule, {"claim", "requiredValue", "expression", "message"})
        claim = _string(errors, f"{at}.claim", rule.get("claim"))
        expression = _string(errors, f"{at}.expression", rule.get("expression"))
        required = _string(errors, f"{at}.requiredValue", rule.get("requiredValue"))
        message = _string(errors, f"{at}.message", rule.get("message"))
        if claim and expression:
            errors.add(at, "claim and expression can't both be set")
        elif not claim and not expression:
            errors.add(at, "Required value: claim or expression is required")
        elif claim:
            if message:
                errors.add(f"{at}.message", "may not be specified when claim is set")
            if claim in seen_claims:
                errors.add(f"{at}.claim", f"Duplicate value: {claim!r}")
            seen_claims.add(claim)
            rules.append(ClaimValidationRule(claim=claim, required_value=required))
        else:
            if required:
                errors.add(f"{at}.requiredValue", "may not be specified when expression is set")
            if expression in seen_expressions:
                errors.add(f"{at}.expression", f"Duplicate value: {expression!r}")
                continue
            seen_expressions.add(expression)
            compiled = _compile(errors, f"{at}.expression", expression, "claims", "bool")
            if compiled is not None:
                state.email_verified = state.email_verified or selects(compiled, "claims", "email_verified")
                rules.append(ClaimValidationRule(expression=compiled, message=message))
    return tuple(rules)


def _prefixed(errors: _Errors, path: str, value: Any, *, required: bool) -> Mapping_:
    mapping = _mapping(errors, path, value)
    _only(errors, path, mapping, {"claim", "prefix", "expression"})
    claim = _string(errors, f"{path}.claim", mapping.get("claim"))
    expression = _string(errors, f"{path}.expression", mapping.get("expression"))
    prefix = None if mapping.get("prefix") is None else _string(errors, f"{path}.prefix", mapping.get("prefix"))
    if claim and expression:
        errors.add(path, "claim and expression can't both be set")
    elif not claim and not expression:
        if required:
            errors.add(path, "Required value: claim or expression is required")
    elif expression:
        if prefix is not None:
            errors.add(f"{path}.prefix", "may not be specified when expression is set")
        return Mapping_(expression=_compile(errors, f"{path}.expression", expression, "claims"))
    elif prefix is None:
        errors.add(f"{path}.prefix", "Required value: prefix is required when claim is set. "
                   "It can be set to an empty string to disable prefixing")
    return Mapping_(claim=claim, prefix=prefix)


def _claim_or_expression(errors: _Errors, path: str, value: Any) -> Mapping_:
    mapping = _mapping(errors, path, value)
    _only(errors, path, mapping, {"claim", "expression"})
    claim = _string(errors, f"{path}.claim", mapping.get("claim"))
    expression = _string(errors, f"{path}.expression", mapping.get("expression"))
    if claim and expression:
        errors.add(path, "claim and expression can't both be set")
    elif expression:
        return Mapping_(expression=_compile(errors, f"{path}.expression", expression, "claims"))
    return Mapping_(claim=claim)


def _extra(errors: _Errors, path: str, value: Any, state: _EmailUse) -> tuple[ExtraMapping, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        errors.add(path, "must be a list")
        return ()
    found: list[ExtraMapping] = []
    seen: set[str] = set()
    for index, raw in enumerate(value):
        at = f"{path}[{index}]"
        item = _mapping(errors, at, raw)
        _only(errors, at, item, {"key", "valueExpression"})
        key = _string(errors, f"{at}.key", item.get("key"))
        _extra_key(errors, f"{at}.key", key)
        if key in seen:
            errors.add(f"{at}.key", f"Duplicate value: {key!r}")
            continue
        seen.add(key)
        source = _string(errors, f"{at}.valueExpression", item.get("valueExpression"))
        if not source:
            errors.add(f"{at}.valueExpression", "Required value")
            continue
        compiled = _compile(errors, f"{at}.valueExpression", source, "claims")
        if compiled is not None:
            state.email_verified = state.email_verified or selects(compiled, "claims", "email_verified")
            found.append(ExtraMapping(key, compiled))
    return tuple(found)


def _extra_key(errors: _Errors, path: str, key: str) -> None:
    """utilvalidation.IsDomainPrefixedPath, lower case, and no Kubernetes-reserved domain."""
    domain, slash, rest = key.partition("/")
    if not key:
        errors.add(path, "Required value")
        return
    if not slash or not rest:
        errors.add(path, f"Invalid value: {key!r}: must be a domain-prefixed path (such as \"acme.io/foo\")")
    elif len(domain) > 253 or not _DNS1123_SUBDOMAIN.match(domain):
        errors.add(path, f"Invalid value: {domain!r}: a lowercase RFC 1123 subdomain must consist of lower case "
                   "alphanumeric characters, '-' or '.'")
    if key != key.lower():
        errors.add(path, f"Invalid value: {key!r}: must be lowercase")
    if domain in ("kubernetes.io", "k8s.io") or domain.endswith((".kubernetes.io", ".k8s.io")):
        errors.add(path, f"Invalid value: {key!r}: k8s.io, kubernetes.io and their subdomains are reserved "
                   "for Kubernetes use")


def _user_validation_rules(errors: _Errors, path: str, value: Any) -> tuple[UserValidationRule, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        errors.add(path, "must be a list")
        return ()
    rules: list[UserValidationRule] = []
    seen: set[str] = set()
    for index, raw in enumerate(value):
        at = f"{path}[{index}]"
        rule = _mapping(errors, at, raw)
        _only(errors, at, rule, {"expression", "message"})
        expression = _string(errors, f"{at}.expression", rule.get("expression"))
        if not expression:
            errors.add(f"{at}.expression", "Required value")
            continue
        if expression in seen:
            errors.add(f"{at}.expression", f"Duplicate value: {expression!r}")
            continue
        seen.add(expression)
        compiled = _compile(errors, f"{at}.expression", expression, "user", "bool")
        if compiled is not None:
            rules.append(UserValidationRule(compiled, _string(errors, f"{at}.message", rule.get("message"))))
    return tuple(rules)
