"""Discovery from configuration: the embedded default, no ZooKeeper needed."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .base import Endpoint


def _endpoint(value: Endpoint | str, cluster: str = "") -> Endpoint:
    return value if isinstance(value, Endpoint) else Endpoint.from_url(value, cluster=cluster)


class StaticDiscovery:
    """Fixed drivers per cluster and a fixed scheduler list (the first is the master).

    :param drivers: ``{cluster_id: [Endpoint or "http(s)://host:port", ...]}``.
    :param schedulers: schedulers in priority order (``scheduler_master()`` is the first).

    Example::

        StaticDiscovery({"BCS-MESOS-10001": ["https://10.0.0.5:8443"]})
    """

    def __init__(
        self,
        drivers: Mapping[str, Iterable[Endpoint | str]] | None = None,
        schedulers: Iterable[Endpoint | str] = (),
    ) -> None:
        self._drivers = {
            cluster: tuple(_endpoint(item, cluster) for item in items)
            for cluster, items in (drivers or {}).items()
        }
        self._schedulers = tuple(_endpoint(item) for item in schedulers)

    def drivers(self, cluster_id: str) -> tuple[Endpoint, ...]:
        return self._drivers.get(cluster_id, ())

    def registered(self, cluster_id: str) -> bool:
        return cluster_id in self._drivers

    def scheduler_master(self) -> Endpoint | None:
        return self._schedulers[0] if self._schedulers else None

    def schedulers(self) -> tuple[Endpoint, ...]:
        return self._schedulers

    def stale(self) -> bool:
        return False

    def close(self) -> None:
        pass
