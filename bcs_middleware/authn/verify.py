"""One JWT checked against one configured issuer, and its claims mapped to an identity.

The rules are kube-apiserver's ``oidc.Authenticator.AuthenticateToken``
(``staging/src/k8s.io/apiserver/plugin/pkg/authenticator/token/oidc/oidc.go``) on top of
go-oidc's ``IDTokenVerifier.Verify`` (``github.com/coreos/go-oidc/v2/verify.go``):

* the signature: the algorithm must be one of :data:`ALLOWED_ALGORITHMS` (RSA, ECDSA and
  RSA-PSS — never ``none``, never an HMAC, so a public key can never serve as a shared
  secret); the key is the JWKS key with the header's ``kid``, or, for a token without
  one, any key of the set that verifies it (go-oidc's ``RemoteKeySet`` does the same);
* ``iss`` equal to the issuer's URL; ``aud`` (a string or a list) sharing at least one
  value with the configured audiences (``MatchAny``); ``exp`` required and in the future
  (no leeway); ``nbf``, when present, at most five minutes ahead (go-oidc's skew);
* ``claimValidationRules``: a ``claim`` must be present with the ``requiredValue``
  (strings only), an ``expression`` must be ``true``;
* ``claimMappings``: username from a claim (a string; a ``false`` ``email_verified``
  refuses the ``email`` claim) plus its prefix, or from an expression returning a string;
  groups from a claim (a string or a list of strings) plus prefix, or an expression (a
  string or list; empty strings dropped); uid from a claim (a string) or expression;
  extra from expressions (a string or list; empty results omitted);
* ``userValidationRules`` on the mapped user.

Names and groups beginning ``system:`` are Kubernetes' own, and kube-apiserver does not
refuse them from a JWT by default: that is left to ``userValidationRules``, whose
documented example is ``!user.username.startsWith('system:')`` and
``user.groups.all(group, !group.startsWith('system:'))`` (``validation.go`` and
``oidc.go`` check nothing else); the gateway does the same. One group is refused on top,
whatever the rules: ``system:masters``. kube-apiserver's authorizer lets that group do
anything before RBAC or any webhook is asked, so a group claim would make its holder
cluster-admin on every cluster the gateway impersonates them on, past the cluster's own
RBAC; an operator who wants an identity provider's group to administer clusters binds it
to ``cluster-admin`` (the permission subscription does), which each cluster can see and
revoke.

Everything here is pure: keys come in, an :class:`Identity` or a :class:`TokenRejected`
(with the reason a person can act on) comes out.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import jwt

from ..core.printable import escape as printable
from .cel import CompiledExpression, EvaluationError, evaluate
from .config import JWTAuthenticator, Mapping_

__all__ = [
    "ALLOWED_ALGORITHMS",
    "NBF_LEEWAY",
    "Identity",
    "PublicKey",
    "TokenRejected",
    "UnknownKey",
    "public_keys",
    "untrusted_issuer",
    "verify_token",
]

#: oidc.go ``allowedSigningAlgs``: asymmetric signatures only.
ALLOWED_ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512")
#: go-oidc's allowance for an ``nbf`` slightly in the future (clock skew); ``exp`` has none.
NBF_LEEWAY = 300.0
#: kube-apiserver's privileged group (``user.SystemPrivilegedGroup``): never taken from a token.
PRIVILEGED_GROUP = "system:masters"


class TokenRejected(Exception):
    """The token is not valid for this issuer; ``reason`` is for the client (no token in it).

    :param expired_at: the ``exp`` of a token refused only for having expired.
    """

    def __init__(self, reason: str, *, expired_at: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.expired_at = expired_at


@dataclass(frozen=True)
class Identity:
    """Who a verified token says the caller is, mapped as configured."""

    issuer: str
    username: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]
    expires_at: float


def _segment(part: str) -> Any:
    padded = part + "=" * (-len(part) % 4)
    try:
        return json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (ValueError, binascii.Error, UnicodeError):
        return None


def untrusted_issuer(token: str) -> str | None:
    """The ``iss`` of a compact JWT, *unverified*: only to choose which issuer checks it."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    claims = _segment(parts[1])
    if not isinstance(claims, dict) or not isinstance(claims.get("iss"), str):
        return None
    # OpenID Connect Core §15.6.2: Google's legacy issuer without a scheme.
    return "https://accounts.google.com" if claims["iss"] == "accounts.google.com" else claims["iss"]


def key_ids(token: str) -> tuple[str | None, str | None]:
    """The header's ``(alg, kid)``, unverified."""
    header = _segment(token.split(".", 1)[0])
    if not isinstance(header, dict):
        return None, None
    alg, kid = header.get("alg"), header.get("kid")
    return (alg if isinstance(alg, str) else None), (kid if isinstance(kid, str) else None)


@dataclass(frozen=True)
class PublicKey:
    """One signing key of an issuer's JWKS (RFC 7517), ready to verify with."""

    kid: str | None
    family: str
    alg: str | None
    key: Any = field(repr=False, compare=False)


def public_keys(jwks: Any) -> tuple[PublicKey, ...]:
    """The usable signing keys of a JWKS document: RSA and EC, never a symmetric (``oct``) key."""
    if not isinstance(jwks, dict) or not isinstance(jwks.get("keys"), list):
        raise ValueError("not a JWKS document (no keys list)")
    found = []
    for data in jwks["keys"]:
        if not isinstance(data, dict) or data.get("kty") not in ("RSA", "EC") or data.get("use", "sig") != "sig":
            continue
        try:
            key = jwt.PyJWK(data).key
        except jwt.PyJWTError:
            continue  # a key this library cannot use is skipped, as go-jose skips it
        kid, alg = data.get("kid"), data.get("alg")
        found.append(PublicKey(kid if isinstance(kid, str) else None, str(data["kty"]),
                               alg if isinstance(alg, str) else None, key))
    return tuple(found)


def verify_signature(token: str, keys: Sequence[PublicKey]) -> dict[str, Any]:
    """The token's claims once a key of ``keys`` verified it.

    :raises UnknownKey: no key of the set fits the token's ``kid`` and algorithm.
    :raises TokenRejected: the algorithm is not allowed, or the signature is bad.
    """
    alg, kid = key_ids(token)
    if alg not in ALLOWED_ALGORITHMS:
        raise TokenRejected(f"token signed with {printable(str(alg))[:20]}: only {', '.join(ALLOWED_ALGORITHMS)} "
                            "are accepted")
    family = "EC" if alg.startswith("ES") else "RSA"
    candidates = [k for k in keys
                  if (kid is None or k.kid == kid) and k.family == family and k.alg in (None, alg)]
    if not candidates:
        raise UnknownKey(kid)
    for key in candidates:
        try:
            claims = jwt.decode(token, key.key, algorithms=[alg], options={
                "verify_signature": True, "verify_exp": False, "verify_nbf": False, "verify_iat": False,
                "verify_aud": False, "verify_iss": False})
        except jwt.InvalidSignatureError:
            continue
        except jwt.PyJWTError as exc:
            raise TokenRejected(f"malformed token: {type(exc).__name__}") from None
        if not isinstance(claims, dict):
            raise TokenRejected("malformed token: claims are not an object")
        return claims
    if kid is None:
        # go-oidc's RemoteKeySet: a token without kid that no key verifies may be signed with a
        # key published since; the caller refreshes the set (bounded in rate) and tries again.
        raise UnknownKey(None, "token signature does not verify with the issuer's keys")
    raise TokenRejected("token signature does not verify with the issuer's keys")


class UnknownKey(TokenRejected):
    """No key of the set fits the token: the caller may refresh the set and try again."""

    def __init__(self, kid: str | None, reason: str = "") -> None:
        super().__init__(reason or "token signed with a key the issuer does not publish"
                         + (f" (kid {printable(kid)[:64]!r})" if kid else ""))
        self.kid = kid


def check_claims(claims: dict[str, Any], authenticator: JWTAuthenticator, now: float) -> float:
    """``iss``, ``aud``, ``exp``, ``nbf`` (go-oidc's checks); returns ``exp``."""
    issuer = authenticator.issuer
    if claims.get("iss") != issuer.url:
        raise TokenRejected(f"token issued by {printable(str(claims.get('iss')))[:200]!r}, "
                            f"expected {issuer.url!r}")
    audience = claims.get("aud")
    audiences = [audience] if isinstance(audience, str) else audience if isinstance(audience, list) else []
    if not any(isinstance(a, str) and a in issuer.audiences for a in audiences):
        raise TokenRejected(f"token audience {printable(json.dumps(audience))[:200]} is not one of "
                            f"{list(issuer.audiences)} (issuer {issuer.url})")
    exp = claims.get("exp")
    if isinstance(exp, bool) or not isinstance(exp, (int, float)):
        raise TokenRejected("token has no valid exp claim")
    if exp <= now:
        raise TokenRejected(f"token expired at {_when(exp)}; run bcs-middleware login", expired_at=float(exp))
    nbf = claims.get("nbf")
    if nbf is not None:
        if isinstance(nbf, bool) or not isinstance(nbf, (int, float)):
            raise TokenRejected("token has an invalid nbf claim")
        if now + NBF_LEEWAY < nbf:
            raise TokenRejected(f"token not valid before {_when(nbf)}")
    return float(exp)


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def map_identity(claims: dict[str, Any], authenticator: JWTAuthenticator, expires_at: float) -> Identity:
    """The identity of verified ``claims``: mappings, then claim rules, then user rules."""
    username = _username(claims, authenticator.username)
    groups = _groups(claims, authenticator.groups)
    uid = _uid(claims, authenticator.uid)
    extra: list[tuple[str, tuple[str, ...]]] = []
    for mapping in authenticator.extra:
        values = _string_list(_run(mapping.value_expression, claims, "extra"), "extra claim")
        if values:
            extra.append((mapping.key, values))
    for rule in authenticator.claim_validation_rules:
        if rule.expression is None:
            if rule.claim not in claims:
                raise TokenRejected(f"required claim {rule.claim} not present in token")
            value = claims[rule.claim]
            if not isinstance(value, str):
                raise TokenRejected(f"required claim {rule.claim} is not a string")
            if value != rule.required_value:
                raise TokenRejected(f"required claim {rule.claim} value does not match")
        elif _run(rule.expression, claims, "claim validation") is not True:
            raise TokenRejected(f"claim validation rule failed: {rule.message or rule.expression.source}")
    identity = Identity(authenticator.issuer.url, username, uid, groups, tuple(extra), expires_at)
    if authenticator.user_validation_rules:
        user = {"username": username, "uid": uid, "groups": list(groups),
                "extra": {key: list(values) for key, values in extra}}
        for user_rule in authenticator.user_validation_rules:
            if _run(user_rule.expression, user, "user validation") is not True:
                raise TokenRejected(f"user validation rule failed: {user_rule.message or user_rule.expression.source}")
    if PRIVILEGED_GROUP in identity.groups:
        raise TokenRejected(f"group {PRIVILEGED_GROUP} is never accepted from an identity provider (it bypasses "
                            "every cluster's RBAC): bind the group to cluster-admin instead")
    return identity


def _run(expression: CompiledExpression, value: Any, what: str) -> Any:
    try:
        result = evaluate(expression, value)
    except EvaluationError as exc:
        raise TokenRejected(f"error evaluating {what} expression {expression.source!r}: {exc}") from None
    if what.endswith("validation") and not isinstance(result, bool):
        raise TokenRejected(f"{what} expression {expression.source!r} must return a boolean")
    return result


def _username(claims: dict[str, Any], mapping: Mapping_) -> str:
    if mapping.expression is not None:
        value = _run(mapping.expression, claims, "username claim")
        if not isinstance(value, str):
            raise TokenRejected("username claim expression must return a string")
        name = value
    else:
        value = claims.get(mapping.claim)
        if not isinstance(value, str):
            raise TokenRejected(f"username claim {mapping.claim!r} is missing or not a string")
        # OpenID Connect Core §5.1: a present email_verified must be true for email to be trusted.
        if mapping.claim == "email" and "email_verified" in claims and claims["email_verified"] is not True:
            raise TokenRejected("email not verified" if claims["email_verified"] is False
                                else "email_verified claim is not a boolean")
        name = (mapping.prefix or "") + value
    if not name:
        raise TokenRejected("the token maps to an empty user name")
    return name


def _groups(claims: dict[str, Any], mapping: Mapping_) -> tuple[str, ...]:
    if mapping.claim:
        if mapping.claim not in claims:
            return ()
        value = claims[mapping.claim]
        # kubernetes/kubernetes#33290: a single string claim ("role") may serve as the groups.
        found = [value] if isinstance(value, str) else value
        if not isinstance(found, list) or not all(isinstance(g, str) for g in found):
            raise TokenRejected(f"groups claim {mapping.claim!r} must be a string or a list of strings")
        return tuple((mapping.prefix or "") + g for g in found)
    if mapping.expression is None:
        return ()
    return _string_list(_run(mapping.expression, claims, "groups claim"), "group claim")


def _uid(claims: dict[str, Any], mapping: Mapping_) -> str:
    if mapping.claim:
        value = claims.get(mapping.claim)
        if not isinstance(value, str):
            raise TokenRejected(f"uid claim {mapping.claim!r} is missing or not a string")
        return value
    if mapping.expression is None:
        return ""
    value = _run(mapping.expression, claims, "uid claim")
    if not isinstance(value, str):
        raise TokenRejected("uid claim expression must return a string")
    return value


def _string_list(value: Any, what: str) -> tuple[str, ...]:
    """oidc.go ``convertCELValueToStringList``: a string or list of strings; "" and [] are absent."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(v for v in value if v)
    raise TokenRejected(f"error evaluating {what} expression: expression must return a string or a list of strings")


def verify_token(token: str, authenticator: JWTAuthenticator, keys: Iterable[PublicKey], now: float) -> Identity:
    """Verify ``token`` for ``authenticator`` with ``keys``; see the module docstring.

    :raises UnknownKey: no key fits (refresh the key set and call again).
    :raises TokenRejected: any other reason, said for the client.
    """
    claims = verify_signature(token, list(keys))
    expires_at = check_claims(claims, authenticator, now)
    return map_identity(claims, authenticator, expires_at)
