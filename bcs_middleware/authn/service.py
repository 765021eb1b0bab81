"""JWT authentication for several issuers, with each verified identity cached until it expires.

:class:`JWTAuthenticators` holds one verifier per ``jwt[]`` entry of the
:class:`~.config.AuthenticationConfiguration`. For a token it

1. reads the token's ``iss`` *unverified* only to pick the entry whose ``issuer.url`` it
   names (as kube-apiserver's union of JWT authenticators does; an unknown issuer is
   refused by name — no other issuer's keys are ever tried, so another issuer's token
   with a matching ``kid`` is still checked against its own issuer only);
2. verifies it with that issuer's keys (:mod:`.keys`), fetching the key set again once
   when the token's key is unknown (bounded in rate there);
3. resolves a distributed groups claim (:mod:`.claim_sources`): the JWT its source
   answers is verified with the keys of the (configured) issuer it names, for this
   entry's audiences;
4. maps its claims (:mod:`.verify`) to an :class:`~.verify.Identity`.

The answer is cached by the token's SHA-256 digest until the token's ``exp`` (bounded by
``max_age``), so the request path pays one dictionary lookup per request, not a
signature check; a cached identity whose token has expired since is refused all the
same. Refusals are cached for ``negative_ttl`` seconds (a client repeating a bad token
costs one verification per interval). The cache is bounded in entries.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from ..core.cache import Cache
from ..core.printable import escape
from ..outbound.transport import Transport
from ..store.crypto import token_digest
from .claim_sources import distributed_source, fetch_claim_token
from .config import AuthenticationConfiguration, JWTAuthenticator
from .keys import IssuerKeys, KeysUnavailable
from .verify import (
    Identity,
    TokenRejected,
    UnknownKey,
    check_claims,
    map_identity,
    untrusted_issuer,
    verify_signature,
)

__all__ = ["JWTAuthenticators", "Refusal", "looks_like_jwt"]


def looks_like_jwt(token: str) -> bool:
    """Whether a bearer token is a compact JWS (three dot-separated parts), not a gateway token.

    Gateway tokens are 43 URL-safe characters without a dot (:func:`~bcs_middleware.store.crypto.new_token`),
    so the two kinds never overlap and a token is only ever checked as one of them.
    """
    return token.count(".") == 2


@dataclass(frozen=True)
class Refusal:
    """Why a token was refused; ``unavailable``: the issuer's keys could not be fetched (retry later:
    such a refusal is never cached, the issuer's keys remember their failure for a few seconds)."""

    reason: str
    unavailable: bool = False
    until: float = 0.0


class _Issuer:
    def __init__(self, config: JWTAuthenticator, keys: IssuerKeys) -> None:
        self.config = config
        self.keys = keys

    def claims(self, token: str, now: float, *,
               checked_as: JWTAuthenticator | None = None) -> tuple[dict[str, Any], float]:
        """The verified claims of ``token`` and its ``exp`` (``checked_as``: whose audiences count)."""
        keys = self.keys.keys()
        try:
            claims = verify_signature(token, keys)
        except UnknownKey:
            fresh = self.keys.refresh(keys)
            if fresh is None:
                raise
            claims = verify_signature(token, fresh)
        return claims, check_claims(claims, checked_as or self.config, now)


class JWTAuthenticators:
    """Every configured JWT issuer (see the module docstring).

    :param configuration: the validated configuration.
    :param transport: the process's outbound transport (discovery and JWKS go through it).
    :param max_entries: verified tokens (and refusals) remembered per process.
    :param max_age: the longest an identity is remembered, whatever its token's ``exp``.
    :param negative_ttl: seconds a refusal is remembered.
    :param clock: wall-clock seconds (tests move it).
    """

    def __init__(self, configuration: AuthenticationConfiguration, transport: Transport, *,
                 max_entries: int = 10_000, max_age: float = 3600.0, negative_ttl: float = 5.0,
                 key_refresh_interval: float = 10.0, fetch_timeout: float = 10.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.configuration = configuration
        self.transport = transport
        self.fetch_timeout = fetch_timeout
        self.negative_ttl = negative_ttl
        self.clock = clock
        self._issuers = {
            entry.issuer.url: _Issuer(entry, IssuerKeys(entry.issuer, transport, timeout=fetch_timeout,
                                                        refresh_interval=key_refresh_interval))
            for entry in configuration.jwt
        }
        self._cache: Cache[str, Identity | Refusal] = Cache(max_entries=max_entries, max_age=max_age)

    @property
    def issuers(self) -> Iterable[str]:
        return self._issuers.keys()

    def issuer_keys(self, url: str) -> IssuerKeys:
        return self._issuers[url].keys

    def authenticate(self, token: str) -> Identity | Refusal:
        """The identity of ``token``, or why it is refused (never raises for a bad token)."""
        now = self.clock()
        key = token_digest(token)
        found = self._cache.get(key)
        if isinstance(found, Identity):
            if found.expires_at > now:
                return found
            refusal = Refusal(f"token expired at {_when(found.expires_at)}; run bcs-middleware login",
                              until=now + 3600.0)
            self._cache.put(key, refusal)
            return refusal
        if isinstance(found, Refusal) and found.until > now:
            return found
        answer = self._verify(token, now)
        if isinstance(answer, Identity) or not answer.unavailable:
            self._cache.put(key, answer)
        return answer

    def _verify(self, token: str, now: float) -> Identity | Refusal:
        issuer_url = untrusted_issuer(token)
        if issuer_url is None:
            return Refusal("malformed token: not a JWT with an iss claim", until=now + self.negative_ttl)
        issuer = self._issuers.get(issuer_url)
        if issuer is None:
            return Refusal(f"token issuer {escape(issuer_url)[:200]!r} is not configured",
                           until=now + self.negative_ttl)
        try:
            claims, expires_at = issuer.claims(token, now)
            claims, expires_at = self._distributed(issuer, claims, expires_at, now)
            return map_identity(claims, issuer.config, expires_at)
        except TokenRejected as exc:
            # An expired token stays expired: remember that until the cache drops it.
            until = now + (self.negative_ttl if exc.expired_at is None else 3600.0)
            return Refusal(exc.reason, until=until)
        except KeysUnavailable as exc:
            return Refusal(f"cannot verify the token now: {exc} (the identity provider cannot be reached: "
                           "your sign-in may be fine, try again shortly)", unavailable=True)

    def _distributed(self, issuer: _Issuer, claims: dict[str, Any], expires_at: float,
                     now: float) -> tuple[dict[str, Any], float]:
        """``claims`` with a distributed groups claim resolved (:mod:`.claim_sources`)."""
        claim = issuer.config.groups.claim
        source = distributed_source(claims, claim) if claim else None
        if source is None:
            return claims, expires_at
        token = fetch_claim_token(self.transport, source, claim, timeout=self.fetch_timeout,
                                  ca_pem=issuer.config.issuer.certificate_authority or None)
        # oidc.go verifies the answer as an ID token for this authenticator's audiences, from
        # the issuer it names: here that issuer must be one of the configured ones.
        source_issuer = self._issuers.get(untrusted_issuer(token) or "")
        if source_issuer is None:
            raise TokenRejected(f"could not expand distributed claims: the {claim} claim source answered a "
                                "token of an issuer that is not configured")
        checked_as = replace(source_issuer.config, issuer=replace(source_issuer.config.issuer,
                                                                  audiences=issuer.config.issuer.audiences))
        try:
            found, found_expires_at = source_issuer.claims(token, now, checked_as=checked_as)
        except TokenRejected as exc:
            # Said as the source's failure, and not remembered as the ID token's own expiry.
            raise TokenRejected(f"could not expand distributed claims: {exc.reason}") from None
        if claim not in found:
            raise TokenRejected(f"could not expand distributed claims: the token the {claim} claim source "
                                f"answered has no {claim} claim")
        # The identity is cached until the earlier of the two tokens expires.
        return {**claims, claim: found[claim]}, min(expires_at, found_expires_at)


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))
