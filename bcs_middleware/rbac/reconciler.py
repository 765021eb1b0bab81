"""Make each cluster's owned bindings match the grants — and touch nothing else.

:func:`reconcile_cluster` does one cluster: it lists the bindings labelled
``app.kubernetes.io/managed-by=bcs-middleware``, creates the missing ones,
replaces drifted ones, deletes owned ones no grant asks for (with a ``uid``
precondition), and leaves every object without the label alone — even one that
has the name a grant wants, which is reported as a failure instead.

:class:`Reconciler` schedules clusters: each runs on a bounded thread pool
without anyone waiting for it, so a cluster that hangs until its timeouts only
holds its own worker. A cluster is due when the grants changed since its last
pass (unless it was unreachable), when its credentials changed, after
``interval`` seconds, or — after a failure — when its backoff (``backoff_base`` doubling up to ``backoff_max``,
with jitter) has passed.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..core.records import CredentialRecord
from ..outbound.transport import Transport
from .kube import BindingClient, KubeError
from .model import OWNED_SELECTOR, Binding, Permissions, desired_bindings, is_owned, needs_update

log = logging.getLogger(__name__)

#: At most this many per-binding error messages are kept in an outcome.
MAX_ERRORS = 10


@dataclass(frozen=True)
class ClusterOutcome:
    """What one run did on one cluster. ``error`` is set when the run could not proceed at all."""

    cluster_id: str
    started_at: datetime
    finished_at: datetime
    digest: str
    created: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    failed: int = 0
    error: str | None = None
    errors: tuple[str, ...] = ()
    retry_in: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.failed == 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "cluster_id": self.cluster_id,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat(),
            "grants_digest": self.digest,
            "result": "ok" if self.ok else ("error" if self.error else "partial"),
            "created": self.created,
            "updated": self.updated,
            "deleted": self.deleted,
            "unchanged": self.unchanged,
            "failed": self.failed,
            "error": self.error,
            "errors": list(self.errors),
            "retry_in": self.retry_in,
        }


@dataclass
class _Counts:
    created: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    def fail(self, message: str) -> None:
        self.failed += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(message)


def _key(obj: dict[str, Any], kind: str) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return (kind, meta.get("namespace") or "", meta.get("name") or "")


def reconcile_cluster(client: BindingClient, wanted: dict[tuple[str, str, str], Binding],
                      digest: str) -> ClusterOutcome:
    """One pass over one cluster. Listing failures end the pass (``error``); per-object ones are counted."""
    started = datetime.now(UTC)
    counts = _Counts()
    try:
        owned: dict[tuple[str, str, str], dict[str, Any]] = {}
        for kind in ("ClusterRoleBinding", "RoleBinding"):
            for obj in client.list_owned(kind, OWNED_SELECTOR):
                if is_owned(obj):  # the server filtered already; never trust that for deletes
                    owned[_key(obj, kind)] = obj
        for key, binding in wanted.items():
            _apply(client, binding, owned.get(key), counts)
        for key, obj in owned.items():
            if key in wanted:
                continue
            kind, namespace, name = key
            try:
                client.delete(kind, namespace or None, name, (obj.get("metadata") or {}).get("uid"))
                counts.deleted += 1
            except KubeError as exc:
                if exc.status == 0:
                    raise
                counts.fail(f"delete {kind} {namespace + '/' if namespace else ''}{name}: {exc}")
    except KubeError as exc:
        return ClusterOutcome(client.cluster_id, started, datetime.now(UTC), digest, counts.created,
                              counts.updated, counts.deleted, counts.unchanged, counts.failed, str(exc),
                              tuple(counts.errors))
    return ClusterOutcome(client.cluster_id, started, datetime.now(UTC), digest, counts.created, counts.updated,
                          counts.deleted, counts.unchanged, counts.failed, None, tuple(counts.errors))


def _apply(client: BindingClient, binding: Binding, existing: dict[str, Any] | None, counts: _Counts) -> None:
    where = f"{binding.kind} {binding.namespace + '/' if binding.namespace else ''}{binding.name}"
    try:
        if existing is None:
            try:
                client.create(binding)
                counts.created += 1
                return
            except KubeError as exc:
                if exc.status != 409:
                    raise
            existing = client.get(binding)
            if existing is None or not is_owned(existing):
                counts.fail(f"{where}: exists and is not managed by bcs-middleware; left alone")
                return
        if not needs_update(existing, binding):
            counts.unchanged += 1
            return
        if existing.get("roleRef") != binding.body["roleRef"]:
            # roleRef is immutable in Kubernetes: replace the object instead.
            client.delete(binding.kind, binding.namespace, binding.name, (existing.get("metadata") or {}).get("uid"))
            client.create(binding)
        else:
            client.replace(binding, str((existing.get("metadata") or {}).get("resourceVersion") or ""))
        counts.updated += 1
    except KubeError as exc:
        if exc.status == 0:
            raise  # the cluster itself is unreachable: end this pass
        counts.fail(f"{where}: {exc}")


@dataclass
class _ClusterState:
    digest: str | None = None
    credentials_at: datetime | None = None
    next_due: float = 0.0
    failures: int = 0
    unreachable: bool = False
    in_flight: bool = False


class Reconciler:
    """Runs :func:`reconcile_cluster` for due clusters on a bounded pool, never waiting for one.

    :param transport: pooled HTTP transport (its timeouts bound every call).
    :param interval: seconds between periodic passes of a healthy cluster.
    :param backoff_base: first retry delay after a failure; doubles per failure.
    :param backoff_max: the longest retry delay.
    :param max_workers: clusters reconciled at the same time.
    :param on_outcome: called (from a worker thread) with every finished pass.
    :param tls_server_name: verify apiserver certificates for this name (as the tunnel does).
    :param verify: ``False`` only when an operator turned TLS checking off.
    """

    def __init__(self, transport: Transport, *, interval: float = 300.0, backoff_base: float = 2.0,
                 backoff_max: float = 300.0, max_workers: int = 8,
                 on_outcome: Callable[[ClusterOutcome], None] | None = None,
                 tls_server_name: str | None = None, verify: bool = True) -> None:
        self.transport = transport
        self.interval = interval
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.max_workers = max_workers
        self.on_outcome = on_outcome
        self.tls_server_name = tls_server_name
        self.verify = verify
        self._lock = threading.Lock()
        self._states: dict[str, _ClusterState] = {}
        self._futures: set[Future[None]] = set()
        self._pool: ThreadPoolExecutor | None = None

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.max_workers, thread_name_prefix="bcs-rbac")
        return self._pool

    def schedule(self, permissions: Permissions, clusters: Iterable[CredentialRecord],
                 now: float | None = None) -> list[str]:
        """Submit every due cluster; return their ids. Clusters not listed are forgotten."""
        now = time.monotonic() if now is None else now
        submitted = []
        with self._lock:
            present = set()
            for creds in clusters:
                present.add(creds.cluster_id)
                state = self._states.setdefault(creds.cluster_id, _ClusterState())
                if state.in_flight:
                    continue
                if state.credentials_at != creds.updated_at:
                    state.credentials_at, state.failures, state.next_due = creds.updated_at, 0, now
                    state.unreachable = False
                # New grants go out at once — except to a cluster that could not be
                # reached, which waits for its backoff like any other retry.
                changed = state.digest != permissions.digest and not state.unreachable
                if not changed and now < state.next_due:
                    continue
                state.in_flight = True
                future = self._executor().submit(self._run, permissions, creds)
                self._futures.add(future)
                future.add_done_callback(self._futures.discard)
                submitted.append(creds.cluster_id)
            for gone in set(self._states) - present:
                if not self._states[gone].in_flight:
                    del self._states[gone]
        return submitted

    def _run(self, permissions: Permissions, creds: CredentialRecord) -> None:
        client = BindingClient(creds, self.transport, tls_server_name=self.tls_server_name, verify=self.verify)
        try:
            outcome = reconcile_cluster(client, desired_bindings(permissions, creds.cluster_id), permissions.digest)
        except Exception as exc:  # a bug must not kill the worker silently nor stop retries
            log.exception("rbac: reconciling cluster %s failed unexpectedly", creds.cluster_id)
            now = datetime.now(UTC)
            outcome = ClusterOutcome(creds.cluster_id, now, now, permissions.digest,
                                     error=f"internal error: {type(exc).__name__}")
        with self._lock:
            state = self._states.setdefault(creds.cluster_id, _ClusterState())
            state.in_flight = False
            state.unreachable = outcome.error is not None
            # These grants were tried: a pass that failed on some bindings (a name
            # taken by a binding we do not own) waits for its backoff, like any
            # other failure, instead of being "changed" again at every tick.
            state.digest = permissions.digest
            if outcome.ok:
                state.failures = 0
                delay = self.interval
            else:
                state.failures += 1
                delay = min(self.backoff_base * 2 ** (state.failures - 1), self.backoff_max)
                delay *= random.uniform(0.8, 1.2)  # noqa: S311 -- jitter spreads retries, not a secret
                outcome = dataclasses.replace(outcome, retry_in=round(delay, 3))
            state.next_due = time.monotonic() + delay
        _log_outcome(outcome)
        if self.on_outcome is not None:
            try:
                self.on_outcome(outcome)
            except Exception:
                log.exception("rbac: recording the outcome for cluster %s failed", creds.cluster_id)

    def forget(self) -> None:
        """Drop what is known about idle clusters, so each is reconciled at the next schedule.

        Called when this process (re)gains the lease: another leader may have
        changed the clusters meanwhile.
        """
        with self._lock:
            self._states = {cid: st for cid, st in self._states.items() if st.in_flight}

    def in_flight(self) -> int:
        return len(self._futures)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for passes in flight; True when none is left."""
        pending = list(self._futures)
        if not pending:
            return True
        _, not_done = wait(pending, timeout=timeout)
        return not not_done

    def shutdown(self, timeout: float = 10.0) -> bool:
        """Cancel queued passes, wait up to ``timeout`` for running ones; True when all ended."""
        pool, self._pool = self._pool, None
        if pool is None:
            return True
        pool.shutdown(wait=False, cancel_futures=True)
        done = self.wait(timeout)
        with self._lock:
            for state in self._states.values():
                state.in_flight = False
        return done


def _log_outcome(outcome: ClusterOutcome) -> None:
    counts = (f"created={outcome.created} updated={outcome.updated} deleted={outcome.deleted} "
              f"unchanged={outcome.unchanged} failed={outcome.failed}")
    if outcome.error:
        log.warning("rbac: cluster %s unreachable or refused (%s); %s; retry in %.1fs",
                    outcome.cluster_id, outcome.error, counts, outcome.retry_in or 0)
    elif outcome.failed:
        log.warning("rbac: cluster %s reconciled with failures: %s; first: %s; retry in %.1fs",
                    outcome.cluster_id, counts, outcome.errors[0] if outcome.errors else "", outcome.retry_in or 0)
    else:
        log.info("rbac: cluster %s reconciled: %s", outcome.cluster_id, counts)
