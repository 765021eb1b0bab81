"""Admission webhook definitions in the SQL store (the admission layer's ``DefinitionStore``).

Documents are stored as JSON and parsed on read; parsed lists are cached per
process until the ``webhooks`` revision moves. The revision itself is re-read
at most every ``refresh`` seconds, so a change made through any worker or any
gateway reaches every other one within ``refresh`` — and the request path costs
no database round trip in between.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from ..admission.definitions import BcsDefinition, K8sConfiguration, parse_bcs_definition, parse_k8s_configuration
from ..core.errors import Conflict
from ..core.quotas import QuotaExceeded
from . import models as m
from .database import Database
from .rows import WEBHOOKS_TOPIC as TOPIC

_BCS = "bcs"
_K8S = "k8s"


class RevisionedDatabase(Protocol):
    """What :class:`SQLDefinitionStore` needs (``SQLStore`` has it): the database its rows live
    in, and the ``webhooks`` revision that tells every process when to re-read them."""

    @property
    def db(self) -> Database: ...

    def revision(self, topic: str) -> int: ...

    def bump_revision(self, conn: Connection, topic: str) -> None: ...


class SQLDefinitionStore:
    """:param store: the gateway's store (:class:`RevisionedDatabase`; ``SQLStore`` has it).
    :param refresh: how stale (seconds) a process may see the definitions.
    :param bcs_cluster: the Mesos cluster whose bcs definitions this store reads and
        writes (``""``: the gateway-wide ones, managed by superusers under ``/rest/``).
        The gateway manages a cluster's own under ``/bcsapi/v4/scheduler/mesos/…``.
    :param inherit: with ``bcs_cluster``, :meth:`list_bcs` also returns the
        gateway-wide definitions, which win over the cluster's own for the same
        (operation, kind) — what that cluster's driver admits with.
    """

    def __init__(self, store: RevisionedDatabase, *, refresh: float = 2.0, bcs_cluster: str = "",
                 inherit: bool = False) -> None:
        self.store = store
        self.refresh = refresh
        self.bcs_cluster = bcs_cluster
        self.inherit = inherit and bool(bcs_cluster)
        self._lock = threading.Lock()
        self._checked = 0.0
        self._version = -1
        self._cache: dict[tuple[str, str], Any] = {}

    # -- versioning ----------------------------------------------------------------

    def version(self) -> int:
        now = time.monotonic()
        if now - self._checked >= self.refresh:
            version = self.store.revision(TOPIC)
            with self._lock:
                if version != self._version:
                    self._cache.clear()
                    self._version = version
                self._checked = now
        return self._version

    def _changed(self) -> None:
        with self._lock:
            self._checked = 0.0  # this process sees its own writes at once

    def _rows(self, flavor: str, cluster_id: str) -> list[Any]:
        key = (flavor, cluster_id)
        version = self.version()
        with self._lock:
            if key in self._cache and self._version == version:
                return list(self._cache[key])
        with self.store.db.connection() as conn:
            rows = conn.execute(
                select(m.webhook_definitions.c.document)
                .where(m.webhook_definitions.c.flavor == flavor, m.webhook_definitions.c.cluster_id == cluster_id)
                .order_by(m.webhook_definitions.c.kind, m.webhook_definitions.c.name)
            ).all()
        parsed = [
            parse_bcs_definition(r.document) if flavor == _BCS else parse_k8s_configuration(r.document) for r in rows
        ]
        with self._lock:
            if self._version == version:
                self._cache[key] = parsed
        return list(parsed)

    def _put(self, flavor: str, cluster_id: str, kind: str, name: str, match_key: str, document: Any,
             limit: int | None = None) -> bool:
        table = m.webhook_definitions
        now = datetime.now(UTC)
        where = (table.c.flavor == flavor, table.c.cluster_id == cluster_id, table.c.kind == kind,
                 table.c.name == name)
        try:
            with self.store.db.transaction() as conn:
                changed = conn.execute(
                    update(table).where(*where).values(match_key=match_key, document=document, updated_at=now)
                ).rowcount
                if not changed:
                    if limit is not None:
                        self._check_quota(conn, cluster_id, limit)
                    conn.execute(
                        insert(table).values(flavor=flavor, cluster_id=cluster_id, kind=kind, name=name,
                                             match_key=match_key, document=document, updated_at=now)
                    )
                self.store.bump_revision(conn, TOPIC)
        except IntegrityError:
            raise Conflict(f"another admission definition already covers {match_key.replace('/', ' ')}"
                           if flavor == _BCS else f"{kind} {name!r} was created concurrently") from None
        finally:
            self._changed()
        return not changed

    @staticmethod
    def _check_quota(conn: Any, cluster_id: str, limit: int) -> None:
        """Refuse one more of the cluster's definitions past ``limit``, under the cluster's row lock
        (two processes creating at once are serialised: the second counts the first's row)."""
        table = m.webhook_definitions
        conn.execute(select(m.clusters.c.id).where(m.clusters.c.id == cluster_id).with_for_update())
        used = int(conn.execute(select(func.count()).select_from(table)
                                .where(table.c.cluster_id == cluster_id)).scalar() or 0)
        if used >= limit:
            raise QuotaExceeded("webhook_configurations_per_cluster", limit, f"cluster {cluster_id!r}", used)

    def _delete(self, flavor: str, cluster_id: str, kind: str, name: str) -> bool:
        table = m.webhook_definitions
        with self.store.db.transaction() as conn:
            found = conn.execute(
                delete(table).where(table.c.flavor == flavor, table.c.cluster_id == cluster_id,
                                    table.c.kind == kind, table.c.name == name)
            ).rowcount
            if found:
                self.store.bump_revision(conn, TOPIC)
        self._changed()
        return bool(found)

    # -- bcs definitions -------------------------------------------------------------

    def list_bcs(self) -> list[BcsDefinition]:
        own = self._rows(_BCS, self.bcs_cluster)
        if not self.inherit:
            return sorted(own, key=lambda d: d.name)
        wide = self._rows(_BCS, "")
        covered = {d.key for d in wide}
        return sorted(wide + [d for d in own if d.key not in covered], key=lambda d: d.name)

    def get_bcs(self, name: str) -> BcsDefinition | None:
        return next((d for d in self.list_bcs() if d.name == name), None)

    def put_bcs(self, definition: BcsDefinition, *, limit: int | None = None) -> bool:
        match_key = f"{definition.operation}/{definition.kind}"
        if self.bcs_cluster and any(d.key == definition.key for d in self._rows(_BCS, "")):
            # A cluster's editors may add admission, never replace a superuser's for their cluster.
            raise Conflict(f"a gateway-wide admission definition already covers {match_key.replace('/', ' ')}")
        return self._put(_BCS, self.bcs_cluster, "admissionwebhook", definition.name, match_key,
                         dict(definition.document), limit if self.bcs_cluster else None)

    def delete_bcs(self, name: str) -> bool:
        return self._delete(_BCS, self.bcs_cluster, "admissionwebhook", name)

    # -- Kubernetes configurations ------------------------------------------------------

    def list_k8s(self, cluster_id: str) -> list[K8sConfiguration]:
        return self._rows(_K8S, cluster_id)

    def get_k8s(self, cluster_id: str, kind: str, name: str) -> K8sConfiguration | None:
        return next((c for c in self.list_k8s(cluster_id) if c.kind == kind and c.name == name), None)

    def put_k8s(self, cluster_id: str, configuration: K8sConfiguration, *, limit: int | None = None) -> bool:
        return self._put(_K8S, cluster_id, configuration.kind, configuration.name,
                         f"{configuration.kind}/{configuration.name}", dict(configuration.document), limit)

    def delete_k8s(self, cluster_id: str, kind: str, name: str) -> bool:
        return self._delete(_K8S, cluster_id, kind, name)
