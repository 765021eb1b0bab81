"""An issuer's signing keys: OpenID discovery, then its JWKS, through the gateway's outbound stack.

:class:`IssuerKeys` fetches ``{issuer}/.well-known/openid-configuration`` (or the
configured ``discoveryURL``, as kube-apiserver's ``discoveryURLRoundTripper`` rewrites
it), checks that the document names the configured issuer (OpenID Connect Discovery
§4.3; go-oidc's ``NewProvider`` refuses a mismatch), then the document's ``jwks_uri``.
Every request goes through the one :class:`~bcs_middleware.outbound.transport.Transport`
of the process: its timeouts, its address policy and verified TLS (the issuer's
``certificateAuthority``, else the system's roots); an answer is read to at most
:data:`MAX_DOCUMENT` bytes.

* The key set is kept and used until a token names a ``kid`` it does not hold (or, for a
  token without ``kid``, no key verifies): then it is fetched again — at most once per
  ``refresh_interval`` seconds, so a client inventing ``kid`` values costs one fetch per
  interval, not one per request.
* A failed fetch is remembered for ``failure_backoff`` seconds: a provider that is down is
  asked again after that, not by every request meanwhile, and its tokens are answered
  at once with :class:`KeysUnavailable`.
* Each issuer has its own lock, so one provider that is down or slow never holds up
  requests carrying tokens of another; a request only ever waits for its own issuer, and
  at most the transport's timeouts.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..outbound.transport import Transport
from .config import Issuer
from .fetch import FetchFailed, fetch
from .verify import PublicKey, public_keys

__all__ = ["MAX_DOCUMENT", "IssuerKeys", "KeysUnavailable"]

#: Largest discovery document or JWKS read.
MAX_DOCUMENT = 1024 * 1024
WELL_KNOWN = "/.well-known/openid-configuration"


class KeysUnavailable(Exception):
    """The issuer's keys could not be fetched (the reason names the issuer, never a token)."""


@dataclass(frozen=True)
class _Fetched:
    keys: tuple[PublicKey, ...]
    at: float


class IssuerKeys:
    """The signing keys of one issuer (see the module docstring).

    :param issuer: the configured issuer.
    :param transport: the process's outbound transport.
    :param timeout: bound on each fetch (connect and every read).
    :param refresh_interval: least seconds between two fetches of the key set.
    :param failure_backoff: seconds a failed fetch is answered from memory.
    """

    def __init__(self, issuer: Issuer, transport: Transport, *, timeout: float = 10.0,
                 refresh_interval: float = 10.0, failure_backoff: float = 5.0) -> None:
        self.issuer = issuer
        self.transport = transport
        self.timeout = timeout
        self.refresh_interval = refresh_interval
        self.failure_backoff = failure_backoff
        self.fetches = 0
        self._lock = threading.Lock()
        self._current: _Fetched | None = None
        self._jwks_uri: str | None = None
        self._failed: tuple[str, float] | None = None

    def keys(self) -> tuple[PublicKey, ...]:
        """The key set, fetched on first use.

        :raises KeysUnavailable: it could not be fetched (now or within the backoff).
        """
        current = self._current
        if current is not None:
            return current.keys
        return self._fetch(stale=None)

    def refresh(self, stale: tuple[PublicKey, ...]) -> tuple[PublicKey, ...] | None:
        """A newer key set than ``stale``, or ``None`` when none may be fetched yet (rate bound)."""
        current = self._current
        if current is not None and current.keys is not stale:
            return current.keys  # another request refreshed it meanwhile
        if current is not None and time.monotonic() - current.at < self.refresh_interval:
            return None
        keys = self._fetch(stale=stale)
        return None if keys is stale else keys

    def _fetch(self, *, stale: tuple[PublicKey, ...] | None) -> tuple[PublicKey, ...]:
        with self._lock:
            current = self._current
            if current is not None and current.keys is not stale:
                return current.keys
            failed = self._failed
            if failed is not None and time.monotonic() - failed[1] < self.failure_backoff:
                raise KeysUnavailable(failed[0])
            try:
                keys = self._load()
            except KeysUnavailable as exc:
                self._failed = (str(exc), time.monotonic())
                if current is not None:
                    current_kept = _Fetched(current.keys, time.monotonic())
                    self._current = current_kept  # keep using the old set; retry after the interval
                raise
            self._failed = None
            self._current = _Fetched(keys, time.monotonic())
            return keys

    def _load(self) -> tuple[PublicKey, ...]:
        if self._jwks_uri is None:
            discovery = self.issuer.discovery_url or self.issuer.url.rstrip("/") + WELL_KNOWN
            document = self._get_json(discovery, "discovery document")
            if not isinstance(document, dict):
                raise KeysUnavailable(f"issuer {self.issuer.url}: the discovery document is not an object")
            if document.get("issuer") != self.issuer.url:
                raise KeysUnavailable(f"issuer {self.issuer.url}: the discovery document names another issuer")
            uri = document.get("jwks_uri")
            if not isinstance(uri, str) or urlsplit(uri).scheme != "https":
                raise KeysUnavailable(f"issuer {self.issuer.url}: the discovery document has no https jwks_uri")
            self._jwks_uri = uri
        try:
            keys = public_keys(self._get_json(self._jwks_uri, "key set"))
        except ValueError as exc:
            raise KeysUnavailable(f"issuer {self.issuer.url}: {exc}") from None
        return keys

    def _get_json(self, url: str, what: str) -> Any:
        self.fetches += 1
        try:
            body = fetch(self.transport, url, what=what, timeout=self.timeout, max_bytes=MAX_DOCUMENT,
                         ca_pem=self.issuer.certificate_authority or None, headers=[("Accept", "application/json")])
        except FetchFailed as exc:
            raise KeysUnavailable(f"issuer {self.issuer.url}: {exc}") from None
        try:
            return json.loads(body)
        except ValueError:
            raise KeysUnavailable(f"issuer {self.issuer.url}: {what} is not JSON") from None
