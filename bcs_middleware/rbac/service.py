"""The background runner: permission data in, bindings on every cluster out, one leader per deployment.

Every gateway process may run an :class:`RBACService`; the lease in the store
(:class:`~.leader.LeaderLease`) lets exactly one of them work. Each ``tick``
seconds the service

1. takes or renews the lease — a follower does nothing else;
2. polls its source; new valid data replaces the grants, bad data is logged
   (naming the field) and the previous grants stay in force — if no valid data
   was ever loaded, nothing is applied at all (an empty start never revokes);
3. publishes which clusters each subject is granted anything on to the store,
   where every process's :class:`~bcs_middleware.clusters.permissions.ClusterAuthorizer`
   reads it (a grant gives ``view`` on the cluster);
4. lists the Kubernetes clusters that have credentials and hands the due ones
   to the :class:`~.reconciler.Reconciler` (at start, on change, periodically,
   failing ones with backoff) without waiting for them.

Each pass's outcome is logged, counted in Prometheus metrics and written to the
store, where ``GET /rest/rbac/status`` (:mod:`.api`) reads it from any process.

Example::

    service = RBACService(store, FileSource("/etc/bcs/rbac.yaml"), interval=300)
    service.start()      # in each gunicorn worker (post_fork), not in the master
    ...
    service.stop()       # releases the lease so another process takes over at once
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from ..core.errors import BCSError, ConfigError
from ..core.records import CredentialRecord
from ..outbound.addresses import AddressPolicy
from ..outbound.transport import PooledTransport, Transport
from ..store import models as m
from ..telemetry import metrics
from .leader import LeaderLease, LeaseStore
from .metrics import RBAC_LEADER, RBAC_OPERATIONS, RBAC_RUNS, RBAC_SOURCE_REJECTED
from .model import Permissions, PermissionsError
from .reconciler import ClusterOutcome, Reconciler
from .sources import FileSource, HTTPSource, PermissionSource, SourceError
from .tables import rbac_status

log = logging.getLogger(__name__)

class RBACStore(LeaseStore, Protocol):
    """What :class:`RBACService` needs from the store (``SQLStore`` has it): the database its
    lease and status rows live in, the clusters' credentials, and the grants table it publishes."""

    def get_credentials(self, cluster_id: str) -> CredentialRecord | None: ...

    def replace_rbac_grants(self, entries: set[tuple[str, str, str]]) -> None: ...


SOURCE_SCOPE = "source"
CLUSTER_SCOPE = "cluster:"


def write_status(store: LeaseStore, scope: str, document: dict[str, Any]) -> None:
    """Upsert one status row (last writer wins; only the leader writes)."""
    now = datetime.now(UTC)
    with store.db.transaction() as conn:
        changed = conn.execute(
            update(rbac_status).where(rbac_status.c.scope == scope).values(document=document, updated_at=now)
        ).rowcount
        if not changed:
            try:
                with conn.begin_nested():
                    conn.execute(insert(rbac_status).values(scope=scope, document=document, updated_at=now))
            except IntegrityError:
                conn.execute(
                    update(rbac_status).where(rbac_status.c.scope == scope).values(document=document, updated_at=now)
                )


def read_status(store: LeaseStore) -> dict[str, dict[str, Any]]:
    with store.db.connection() as conn:
        rows = conn.execute(select(rbac_status.c.scope, rbac_status.c.document).order_by(rbac_status.c.scope)).all()
    return {row.scope: row.document for row in rows}


class RBACService:
    """Runs the RBAC reconciler in a background thread of this process while it holds the lease.

    :param store: the shared database (clusters, credentials, lease, status).
    :param source: where permission data comes from.
    :param interval: seconds between periodic passes of each healthy cluster.
    :param tick: seconds between lease renewals and source polls.
    :param lease_ttl: seconds the lease lasts without renewal (several ticks).
    :param holder: this process's id in the lease; default ``host:pid:random``.
    :param transport: HTTP transport to the clusters; default a private :class:`PooledTransport`.
    :param backoff_base: first retry delay for a failing cluster (doubles up to ``backoff_max``).
    :param backoff_max: the longest retry delay.
    :param max_workers: clusters reconciled at the same time.
    :param tls_server_name: verify apiserver certificates for this name (as the tunnel does).
    :param verify: ``False`` only when an operator turned TLS checking off.
    :param connect_timeout: seconds to connect to an apiserver (TCP and TLS), own transport only.
    :param read_timeout: seconds of apiserver silence tolerated, own transport only.
    :param address_policy: where the own transport may connect (the tunnel's policy).
    """

    def __init__(self, store: RBACStore, source: PermissionSource, *, interval: float = 300.0, tick: float = 2.0,
                 lease_ttl: float = 30.0, holder: str | None = None, transport: Transport | None = None,
                 backoff_base: float = 2.0, backoff_max: float = 300.0, max_workers: int = 8,
                 tls_server_name: str | None = None, verify: bool = True, connect_timeout: float = 5.0,
                 read_timeout: float = 30.0, address_policy: AddressPolicy | None = None) -> None:
        if lease_ttl <= 2 * tick:
            raise ValueError("lease_ttl must be more than twice the tick, or the lease expires between renewals")
        self.store = store
        self.source = source
        self.tick_seconds = tick
        self.lease = LeaderLease(store, name="rbac", holder=holder, ttl=lease_ttl)
        self._own_transport = transport is None
        self.transport: Transport = transport or PooledTransport(
            connect_timeout=connect_timeout, read_timeout=read_timeout, stream_idle_timeout=read_timeout,
            pool_maxsize=4, address_policy=address_policy)
        self.reconciler = Reconciler(self.transport, interval=interval, backoff_base=backoff_base,
                                     backoff_max=backoff_max, max_workers=max_workers,
                                     on_outcome=self._record_outcome, tls_server_name=tls_server_name,
                                     verify=verify)
        self.permissions: Permissions | None = None
        self.loaded_at: datetime | None = None
        self.source_error: str | None = None
        self.outcomes: dict[str, ClusterOutcome] = {}
        self._published: str | None = None  # digest of the grants last written to the store
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- lifecycle

    def start(self) -> RBACService:
        """Start the background thread (idempotent). Call it in the process that serves, after a fork."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="bcs-rbac-service", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0, *, release: bool = True) -> None:
        """Stop ticking, let running passes end (bounded), then release the lease.

        With passes still running after ``timeout`` the lease is kept and left to
        expire, so no successor works on a cluster this process still writes to.
        """
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        finished = self.reconciler.shutdown(timeout)
        if release and finished:
            self.lease.release()
        else:
            self.lease.is_leader = False
        RBAC_LEADER.set(0)
        if self._own_transport:
            self.transport.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # the loop must survive a bug or a database outage
                log.exception("rbac: tick failed")
            self._wake.wait(self.tick_seconds)
            self._wake.clear()

    # -- one tick

    def tick(self) -> list[str]:
        """Renew the lease, poll the source, schedule due clusters; the cluster ids submitted."""
        was_leader = self.lease.is_leader
        if not self.lease.acquire():
            RBAC_LEADER.set(0)
            return []
        RBAC_LEADER.set(1)
        if not was_leader:
            self.reconciler.forget()
        self._poll_source(force=not was_leader)
        if self.permissions is None:
            return []
        if self._published != self.permissions.digest or not was_leader:
            self._publish_grants(self.permissions)
        return self.reconciler.schedule(self.permissions, self._clusters())

    def _poll_source(self, *, force: bool) -> None:
        try:
            fresh = self.source.poll(force=force)
        except SourceError as exc:
            self._source_failed("fetch", str(exc))
            return
        except PermissionsError as exc:
            self._source_failed("invalid", str(exc))
            return
        if fresh is None:
            # Unchanged: also after an error, which then still stands (the source
            # will not re-send a bad document it has not changed).
            return
        previous = self.permissions
        self.permissions, self.loaded_at, self.source_error = fresh, datetime.now(UTC), None
        log.info("rbac: loaded %d grants from %s (was %s)", len(fresh.grants), self.source.name,
                 len(previous.grants) if previous else "none")
        self._write_source_status()

    def _publish_grants(self, permissions: Permissions) -> None:
        try:
            self.store.replace_rbac_grants({(g.subject_kind, g.subject, g.cluster) for g in permissions.grants})
        except BCSError:
            log.warning("rbac: cannot publish the grants (database unavailable); retrying at the next tick")
            return
        self._published = permissions.digest

    def _source_failed(self, cause: str, message: str) -> None:
        RBAC_SOURCE_REJECTED.labels(cause).inc()
        kept = (f"keeping the previous {len(self.permissions.grants)} grants" if self.permissions
                else "no grants applied until valid data arrives")
        if message != self.source_error:
            log.error("rbac: permission data from %s %s: %s; %s", self.source.name,
                      "rejected" if cause == "invalid" else "unavailable", message, kept)
        self.source_error = message
        self._write_source_status()

    def _write_source_status(self) -> None:
        try:
            write_status(self.store, SOURCE_SCOPE, self.source_status())
        except BCSError:
            log.warning("rbac: cannot record the source status (database unavailable)")

    def source_status(self) -> dict[str, Any]:
        return {
            "source": self.source.name,
            "holder": self.lease.holder,
            "grants": len(self.permissions.grants) if self.permissions else None,
            "grants_digest": self.permissions.digest if self.permissions else None,
            "loaded_at": self.loaded_at.isoformat() if self.loaded_at else None,
            "error": self.source_error,
            "checked_at": datetime.now(UTC).isoformat(),
        }

    def _clusters(self) -> list[CredentialRecord]:
        with self.store.db.connection() as conn:
            ids = conn.execute(
                select(m.clusters.c.id).where(m.clusters.c.cluster_type == "k8s").order_by(m.clusters.c.id)
            ).scalars().all()
        found = []
        for cluster_id in ids:
            creds = self.store.get_credentials(cluster_id)
            if creds is not None and creds.server_addresses:
                found.append(creds)
        return found

    def _record_outcome(self, outcome: ClusterOutcome) -> None:
        with self._lock:
            self.outcomes[outcome.cluster_id] = outcome
        for operation in ("created", "updated", "deleted", "failed"):
            count = getattr(outcome, operation)
            if count:
                RBAC_OPERATIONS.labels(metrics.cluster_label(outcome.cluster_id), operation).inc(count)
        result = outcome.as_dict()["result"]
        RBAC_RUNS.labels(metrics.cluster_label(outcome.cluster_id), result).inc()
        document = {**outcome.as_dict(), "holder": self.lease.holder}
        try:
            write_status(self.store, CLUSTER_SCOPE + outcome.cluster_id, document)
        except BCSError:
            log.warning("rbac: cannot record the outcome for cluster %s (database unavailable)", outcome.cluster_id)

    # -- introspection

    def status(self) -> dict[str, Any]:
        """This process's view: leadership, source and the last outcome per cluster."""
        with self._lock:
            outcomes = {cid: o.as_dict() for cid, o in sorted(self.outcomes.items())}
        return {"leader": self.lease.is_leader, "holder": self.lease.holder, "source": self.source_status(),
                "clusters": outcomes}

    def wait_idle(self, timeout: float) -> bool:
        """Wait (bounded) until no pass is running; for tests and orderly shutdowns."""
        deadline = time.monotonic() + timeout
        return self.reconciler.wait(max(0.0, deadline - time.monotonic()))



def build_service(store: RBACStore, *, source_file: str | None = None, source_url: str | None = None,
                  source_token_file: str | None = None, source_ca_file: str | None = None,
                  interval: float = 300.0, tls_server_name: str | None = None, verify: bool = True,
                  connect_timeout: float = 5.0, read_timeout: float = 30.0,
                  address_policy: AddressPolicy | None = None, transport: Transport | None = None,
                  max_workers: int = 8) -> RBACService:
    """The service as gateway configuration describes it (``rbac_source_file`` *or* ``rbac_source_url``).

    :param transport: the process's outbound transport (the gateway passes the one every
        layer shares), used for the URL source and the clusters; else one of its own.
    :param max_workers: clusters written to at once (the limits file's ``clients.rbac_sync_workers``).
    :raises ConfigError: no source, both sources, or an unsafe URL configuration.
    """
    if bool(source_file) == bool(source_url):
        raise ConfigError("rbac_enabled needs exactly one of rbac_source_file or rbac_source_url")
    source: PermissionSource
    if source_file:
        source = FileSource(source_file)
    else:
        assert source_url is not None
        try:
            source = HTTPSource(source_url, token_file=source_token_file, ca_file=source_ca_file,
                                poll_interval=min(30.0, interval), transport=transport)
        except ValueError as exc:
            raise ConfigError(f"rbac_source_url: {exc}") from None
    return RBACService(store, source, interval=interval, tls_server_name=tls_server_name, verify=verify,
                       connect_timeout=connect_timeout, read_timeout=read_timeout,
                       address_policy=address_policy, transport=transport, max_workers=max_workers)
