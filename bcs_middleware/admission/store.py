"""Where definitions live, and what admission needs to read from a cluster.

:class:`DefinitionStore` is the small Protocol the admission layer and the CRUD
API depend on. It holds *documents* (the JSON a user registered); parsing is done
by :mod:`.definitions`, so a SQL implementation stores ``definition.document`` as
JSON and parses on read, caching by :meth:`DefinitionStore.version` — a counter
that changes on every write, so readers cache until it moves.

:class:`MemoryDefinitionStore` is the in-process implementation (tests, a single
process, or definitions loaded from a file with :func:`load_definitions_file`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..core.bodies import parse_json, parse_yaml
from ..core.environ import Upstream
from ..core.errors import BadRequest, ConfigError, Conflict, ValidationError
from ..core.quotas import QuotaExceeded
from .definitions import (
    BcsDefinition,
    K8sConfiguration,
    parse_bcs_definition,
    parse_k8s_configuration,
)


@runtime_checkable
class DefinitionStore(Protocol):
    """Storage of bcs definitions and per-cluster Kubernetes webhook configurations."""

    def version(self) -> int:
        """A counter that changes whenever any definition changes."""

    def list_bcs(self) -> list[BcsDefinition]: ...

    def get_bcs(self, name: str) -> BcsDefinition | None: ...

    def put_bcs(self, definition: BcsDefinition, *, limit: int | None = None) -> bool:
        """Create or replace by name; ``True`` if created.

        Raises :class:`~bcs_middleware.core.errors.Conflict` when another definition
        already covers the same (operation, kind), and
        :class:`~bcs_middleware.core.quotas.QuotaExceeded` when creating would make the
        cluster's definitions and configurations more than ``limit``.
        """

    def delete_bcs(self, name: str) -> bool: ...

    def list_k8s(self, cluster_id: str) -> list[K8sConfiguration]: ...

    def get_k8s(self, cluster_id: str, kind: str, name: str) -> K8sConfiguration | None: ...

    def put_k8s(self, cluster_id: str, configuration: K8sConfiguration, *, limit: int | None = None) -> bool:
        """Create or replace by (kind, name); ``True`` if created. ``limit``: as for :meth:`put_bcs`."""

    def delete_k8s(self, cluster_id: str, kind: str, name: str) -> bool: ...


class MemoryDefinitionStore:
    """A thread-safe in-memory :class:`DefinitionStore`."""

    def __init__(
        self,
        bcs: Iterable[BcsDefinition] = (),
        k8s: Mapping[str, Iterable[K8sConfiguration]] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._version = 0
        self._bcs: dict[str, BcsDefinition] = {}
        self._k8s: dict[str, dict[tuple[str, str], K8sConfiguration]] = {}
        for definition in bcs:
            self.put_bcs(definition)
        for cluster_id, configurations in (k8s or {}).items():
            for configuration in configurations:
                self.put_k8s(cluster_id, configuration)

    def version(self) -> int:
        return self._version

    def list_bcs(self) -> list[BcsDefinition]:
        with self._lock:
            return sorted(self._bcs.values(), key=lambda d: d.name)

    def get_bcs(self, name: str) -> BcsDefinition | None:
        return self._bcs.get(name)

    def put_bcs(self, definition: BcsDefinition, *, limit: int | None = None) -> bool:
        with self._lock:
            if definition.name not in self._bcs:
                self._check_limit(limit, len(self._bcs), "bcs definitions")
            for other in self._bcs.values():
                if other.name != definition.name and other.key == definition.key:
                    raise Conflict(
                        f"admissionwebhook {other.name!r} already covers "
                        f"{definition.operation} {definition.kind}"
                    )
            created = definition.name not in self._bcs
            self._bcs[definition.name] = definition
            self._version += 1
            return created

    def delete_bcs(self, name: str) -> bool:
        with self._lock:
            found = self._bcs.pop(name, None) is not None
            self._version += found
            return found

    def list_k8s(self, cluster_id: str) -> list[K8sConfiguration]:
        with self._lock:
            items = self._k8s.get(cluster_id, {})
            return [items[key] for key in sorted(items)]

    def get_k8s(self, cluster_id: str, kind: str, name: str) -> K8sConfiguration | None:
        return self._k8s.get(cluster_id, {}).get((kind, name))

    def put_k8s(self, cluster_id: str, configuration: K8sConfiguration, *, limit: int | None = None) -> bool:
        with self._lock:
            items = self._k8s.setdefault(cluster_id, {})
            key = (configuration.kind, configuration.name)
            created = key not in items
            if created:
                self._check_limit(limit, len(items), f"cluster {cluster_id!r}")
            items[key] = configuration
            self._version += 1
            return created

    @staticmethod
    def _check_limit(limit: int | None, used: int, holder: str) -> None:
        if limit is not None and used >= limit:
            raise QuotaExceeded("webhook_configurations_per_cluster", limit, holder, used)

    def delete_k8s(self, cluster_id: str, kind: str, name: str) -> bool:
        with self._lock:
            found = self._k8s.get(cluster_id, {}).pop((kind, name), None) is not None
            self._version += found
            return found


def load_definitions_file(path: str | Path) -> MemoryDefinitionStore:
    """Read a JSON or YAML file of definitions into a :class:`MemoryDefinitionStore`.

    The file holds ``{"admissionwebhooks": [bcs documents...],
    "clusters": {"<cluster_id>": [webhook configurations...]}}``, or just a list
    of bcs documents. Errors name the file and the offending field.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
        data: Any = parse_json(raw, what=str(path)) if path.suffix == ".json" else parse_yaml(raw, what=str(path))
    except OSError as exc:
        raise ConfigError(f"cannot read admission definitions {path}: {exc}") from None
    except BadRequest as exc:
        raise ConfigError(f"cannot read admission definitions: {exc.message}") from None
    if isinstance(data, list):
        data = {"admissionwebhooks": data}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping or a list of definitions")
    store = MemoryDefinitionStore()
    try:
        for index, document in enumerate(data.get("admissionwebhooks") or []):
            where = f"admissionwebhooks[{index}]"
            store.put_bcs(parse_bcs_definition(document))
        for cluster_id, documents in (data.get("clusters") or {}).items():
            for index, document in enumerate(documents or []):
                where = f"clusters.{cluster_id}[{index}]"
                store.put_k8s(str(cluster_id), parse_k8s_configuration(document))
    except (ValidationError, Conflict) as exc:
        raise ConfigError(f"{path}: {where}: {exc.message}") from None
    return store


@runtime_checkable
class ClusterReader(Protocol):
    """What the Kubernetes protocol reads from a cluster (over the tunnel credentials)."""

    def get_object(self, cluster_id: str, api_path: str) -> dict[str, Any] | None:
        """The object at ``api_path`` (``/api/v1/namespaces/ns/pods/x``), ``None`` if absent."""

    def get_object_as(self, upstream: Upstream, api_path: str) -> dict[str, Any] | None:
        """The object at ``api_path`` read as the request's caller: with ``upstream``'s
        credential and impersonation headers (``bcs.upstream``); ``None`` if absent,
        :class:`~bcs_middleware.core.errors.BCSError` with the cluster's status (403) otherwise."""

    def namespace_labels(self, cluster_id: str, namespace: str) -> dict[str, str]:
        """The labels of a namespace (``{}`` when it has none)."""
