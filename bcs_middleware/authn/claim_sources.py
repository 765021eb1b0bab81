"""Distributed claims (OpenID Connect Core §5.6.2): a groups claim the ID token points to.

A token may carry, instead of its groups claim, a reference to where the groups are::

    "_claim_names": {"groups": "src1"},
    "_claim_sources": {"src1": {"endpoint": "https://idp.example.com/groups", "access_token": "…"}}

kube-apiserver resolves it for the configured ``claimMappings.groups.claim`` only
(``oidc.go``, ``claimResolver.expand``/``resolve``), and so does the gateway, with its rules:

* nothing to do when the claim itself is present, or ``_claim_names`` does not name it;
* ``_claim_names`` without ``_claim_sources``, either not an object, or a name whose source
  is missing, refuse the token; a source without ``endpoint`` is an aggregated claim, which
  kube-apiserver does not resolve either (the claim stays absent);
* the endpoint is fetched with ``GET`` and the source's ``access_token`` as a bearer
  token, and answers a JWT whose claim replaces the reference. The caller verifies that
  JWT (:mod:`.service`).

Stricter than kube-apiserver, since the gateway's outbound rules are: the endpoint must be
``https`` (an access token never crosses in clear), it is fetched through the outbound
stack (address policy, verified TLS with the issuer's ``certificateAuthority``) within the
key fetch's timeout and at most :data:`MAX_CLAIM_TOKEN` bytes, and the JWT it answers must
come from a configured issuer (kube-apiserver discovers any issuer the answer names).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..core.printable import escape as printable
from ..outbound.transport import Transport
from .fetch import FetchFailed, fetch
from .verify import TokenRejected

__all__ = ["MAX_CLAIM_TOKEN", "ClaimSource", "distributed_source", "fetch_claim_token"]

#: The largest answer of a claim source read (a JWT of claims).
MAX_CLAIM_TOKEN = 64 * 1024


@dataclass(frozen=True)
class ClaimSource:
    endpoint: str
    access_token: str = field(default="", repr=False)


def distributed_source(claims: dict[str, Any], claim: str) -> ClaimSource | None:
    """Where ``claim`` is to be fetched from, or ``None`` when it is not distributed.

    :raises TokenRejected: the references are malformed (kube-apiserver's errors).
    """
    if claim in claims or "_claim_names" not in claims:
        return None
    names = claims["_claim_names"]
    if not isinstance(names, dict) or not all(isinstance(v, str) for v in names.values()):
        raise TokenRejected("could not expand distributed claims: error parsing distributed claim names")
    if "_claim_sources" not in claims:
        raise TokenRejected("could not expand distributed claims: no claim sources")
    sources = claims["_claim_sources"]
    if not isinstance(sources, dict):
        raise TokenRejected("could not expand distributed claims: could not parse claim sources")
    source = names.get(claim)
    if source is None:
        return None
    endpoint = sources.get(source)
    if not isinstance(endpoint, dict):
        raise TokenRejected(f"could not expand distributed claims: _claim_names contained a source "
                            f"{printable(source)[:64]!r} missing in _claim_sources")
    url, token = endpoint.get("endpoint", ""), endpoint.get("access_token", "")
    if not isinstance(url, str) or not isinstance(token, str):
        raise TokenRejected("could not expand distributed claims: could not parse claim sources")
    if not url:
        return None  # an aggregated claim ("JWT"): not resolved, as in kube-apiserver
    try:
        parts = urlsplit(url)
    except ValueError:
        parts = None
    if parts is None or parts.scheme != "https" or not parts.hostname:
        raise TokenRejected(f"could not expand distributed claims: the {claim} claim source is not an https URL")
    return ClaimSource(url, token)


def fetch_claim_token(transport: Transport, source: ClaimSource, claim: str, *, timeout: float,
                      ca_pem: str | None = None) -> str:
    """The JWT ``source`` answers (unverified).

    :raises TokenRejected: it could not be fetched in time, or is not a compact JWT.
    """
    headers = [("Accept", "application/jwt, application/json;q=0.5")]
    if source.access_token:
        headers.append(("Authorization", f"Bearer {source.access_token}"))
    host = urlsplit(source.endpoint).hostname
    try:
        body = fetch(transport, source.endpoint, what=f"{claim} claim source at {host}", timeout=timeout,
                     max_bytes=MAX_CLAIM_TOKEN, ca_pem=ca_pem, headers=headers)
    except FetchFailed as exc:
        raise TokenRejected(f"could not expand distributed claims: {exc}") from None
    text = body.decode("ascii", "replace").strip()
    if text.count(".") != 2:
        raise TokenRejected(f"could not expand distributed claims: the {claim} claim source did not answer a JWT")
    return text
