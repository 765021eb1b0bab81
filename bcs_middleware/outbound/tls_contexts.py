"""Client TLS contexts per upstream identity, built once and kept in a bounded table.

A context holds its own certificate store (the cluster's CA bundle), so one per
cluster costs tens of KiB; with credentials rotating and clusters coming and going
they must not pile up. Contexts unused for ``ttl`` seconds, and the least recently
used beyond ``max_entries``, are dropped (connections made with one keep it alive
as long as they live) and rebuilt on next use.
"""

from __future__ import annotations

import logging
import ssl
import threading

from ..core.cache import Cache
from .identity import PoolKey

log = logging.getLogger(__name__)


class TLSContexts:
    """``contexts.context(key, label)``: the client TLS context for ``key``'s settings.

    Verification is on unless ``key.verify`` is false, which is logged (once per
    context built) with the upstream's label.
    """

    def __init__(self, *, max_entries: int, ttl: float) -> None:
        self._lock = threading.Lock()
        self._contexts: Cache[PoolKey, ssl.SSLContext] = Cache(max_entries=max_entries, ttl=ttl)

    def context(self, key: PoolKey, label: str) -> ssl.SSLContext:
        """The context for ``key``; raises ``ssl.SSLError``/``OSError``/``ValueError`` for bad material."""
        with self._lock:
            ctx = self._contexts.get(key)
        if ctx is not None:
            return ctx
        if key.ca_pem and not key.ca_pem.isascii():
            # ssl raises TypeError for it; a PEM bundle is ASCII, so this one is simply bad.
            raise ValueError("the CA bundle is not PEM")
        ctx = ssl.create_default_context(cadata=key.ca_pem) if key.ca_pem else (
            ssl.create_default_context()
        )
        if not key.verify:
            log.warning("TLS verification is OFF for upstream %s (explicitly configured); "
                        "its identity is not checked", label)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if key.client_cert:
            ctx.load_cert_chain(*key.client_cert)
        with self._lock:
            self._contexts.put(key, ctx)
        return ctx

    def prune(self) -> None:
        """Drop the contexts unused for ``ttl`` (lookups only happen on new connections)."""
        with self._lock:
            self._contexts.prune()

    def clear(self) -> None:
        with self._lock:
            self._contexts.clear()

    def forget(self) -> None:
        """Start afresh in a child process (the lock may have been held at the fork)."""
        self._lock = threading.Lock()
        self._contexts.clear()

    def __len__(self) -> int:
        return len(self._contexts)
