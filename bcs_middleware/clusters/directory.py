"""The one place that turns a cluster into an upstream.

Every outbound call to a cluster's apiserver — the tunnel (routing), the admission
layer's reads, the RBAC sync — starts here:

* :class:`CachedDirectory` — clusters and the credentials their kube-agent reported,
  cached per process for ``ttl`` seconds (how long a worker may keep using rotated
  credentials); a cluster that is not ready — unknown, or no credentials reported
  yet — only for ``not_ready_ttl`` (how long a new cluster, or one whose agent just
  connected to another worker or instance, takes to be usable here);
* :func:`upstream_for` — the :class:`~bcs_middleware.core.environ.Upstream` for a cluster:
  its apiserver addresses, the reported CA, the TLS server name, the service-account
  token, and — for a non-superuser with RBAC on — the identity to impersonate, a value
  only the proxy and the cluster reader render as headers.

The cluster id itself is parsed once per request, in the request's facts
(:func:`bcs_middleware.core.facts.classify`), and travels in ``bcs.cluster``.
"""

from __future__ import annotations

import threading
from typing import Protocol

from ..core import environ as env
from ..core.cache import Cache
from ..core.impersonation import Impersonation
from ..core.records import ClusterRecord, CredentialRecord

__all__ = ["CachedDirectory", "ClusterDirectory", "upstream_for"]


class ClusterDirectory(Protocol):
    """Where clusters and their reported credentials come from (``SQLStore`` has both)."""

    def find_cluster(self, cluster_id: str) -> ClusterRecord | None: ...

    def get_credentials(self, cluster_id: str) -> CredentialRecord | None: ...


Answer = tuple[ClusterRecord | None, CredentialRecord | None]

#: How long "no such cluster" or "no credentials yet" is kept (seconds): a worker that
#: answered so goes on answering so this long at most once the agent has reported — to
#: any worker of any instance — while a client asking again and again costs the store
#: a few reads a second per cluster, not one per request.
NOT_READY_TTL = 0.25


class CachedDirectory:
    """A per-process TTL cache over a :class:`ClusterDirectory`.

    ``ttl`` bounds how long a worker keeps using credentials after the kube-agent
    reported new ones; ``not_ready_ttl`` how long it keeps an answer that is not
    ready — no such cluster, or no credentials reported yet — so that a cluster
    becomes usable everywhere within it once its agent has reported (the process the
    agent reported to also :meth:`forget` s at once). ``ttl <= 0`` caches nothing.
    """

    def __init__(self, inner: ClusterDirectory, *, ttl: float = 5.0, not_ready_ttl: float = NOT_READY_TTL,
                 max_entries: int = 10_000) -> None:
        self.inner = inner
        self.ttl = ttl
        self.not_ready_ttl = min(not_ready_ttl, ttl)
        self._lock = threading.Lock()
        self._ready: Cache[str, Answer] = Cache(max_entries=max_entries, max_age=max(ttl, 0.0))
        self._not_ready: Cache[str, Answer] = Cache(max_entries=max_entries,
                                                          max_age=max(self.not_ready_ttl, 0.0))

    def lookup(self, cluster_id: str) -> Answer:
        if self.ttl > 0:
            # One dict read each, no lock: the hit path of every tunnel request.
            hit = self._ready.fresh(cluster_id) or self._not_ready.fresh(cluster_id)
            if hit is not None:
                return hit[0]
        answer = self._load(cluster_id)
        if self.ttl > 0:
            ready = answer[1] is not None and bool(answer[1].server_addresses)
            with self._lock:
                (self._ready if ready else self._not_ready).put(cluster_id, answer)
                (self._not_ready if ready else self._ready).pop(cluster_id)
        return answer

    def forget(self, cluster_id: str) -> None:
        """Load ``cluster_id`` afresh on its next lookup (this process just changed its credentials)."""
        with self._lock:
            self._ready.pop(cluster_id)
            self._not_ready.pop(cluster_id)

    def _load(self, cluster_id: str) -> Answer:
        cluster = self.inner.find_cluster(cluster_id)
        return cluster, self.inner.get_credentials(cluster_id) if cluster is not None else None


def upstream_for(
    credentials: CredentialRecord,
    *,
    impersonate: Impersonation | None = None,
    path: str = "/",
    query: str = "",
    server_name: str | None = None,
    verify: bool = True,
) -> env.Upstream:
    """The apiserver of ``credentials``' cluster as an upstream.

    :param impersonate: the identity to act as (RBAC on, not a superuser); ``None`` acts
        as the cluster's own service account (the credential's rights).
    :param path: the path upstream (already percent-encoded).
    :param server_name: verify the apiserver certificate for this name instead of
        the reported host.
    :param verify: ``False`` only when an operator turned TLS checking off.
    """
    return env.Upstream(
        base_urls=credentials.server_addresses,
        path=path,
        query=query,
        ca_pem=credentials.cacert_pem,
        server_name=server_name or None,
        verify=verify,
        bearer_token=credentials.user_token,
        impersonate=impersonate,
        name=f"cluster:{credentials.cluster_id}",
        # Reported through the agent's tunnel: reached through it, never directly.
        tunnel=credentials.cluster_id if credentials.via_tunnel else None,
    )
