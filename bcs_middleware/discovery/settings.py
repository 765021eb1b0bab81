"""Discovery from configuration: :class:`DiscoverySettings` and the Mesos drivers' discovery they give.

The one place the discovery keys (``zookeeper_hosts``, ``zookeeper_root``, ``zookeeper_timeout``,
``static_drivers``) become a :class:`~bcs_middleware.discovery.base.Discovery`: the gateway's
configuration (:mod:`bcs_middleware.compose.config`) and the ``mesos_routing`` paste filter
(:mod:`bcs_middleware.layers.mesos_route`) both go through :func:`drivers_discovery`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core import converters as conv
from ..core.errors import ConfigError
from .base import DEFAULT_ROOT, Discovery, Endpoint
from .static import StaticDiscovery

#: The ini keys of a drivers' discovery, each with its converter (their names are the
#: :class:`DiscoverySettings` attributes they fill).
DRIVERS_OPTIONS: dict[str, conv.Converter] = {
    "zookeeper_hosts": conv.text,
    "zookeeper_root": conv.text,
    "zookeeper_timeout": conv.seconds,
    "static_drivers": conv.mapping,
}


@dataclass(frozen=True)
class DiscoverySettings:
    """Where Mesos drivers (gateway) or the scheduler master (driver) are: ZooKeeper, or a
    fixed list — cluster → driver URLs for the gateway, scheduler URLs (first = master) for a driver."""

    zookeeper_hosts: str | None = None
    zookeeper_root: str = DEFAULT_ROOT
    zookeeper_timeout: float = 10.0
    static_drivers: tuple[tuple[str, tuple[str, ...]], ...] = ()
    static_schedulers: tuple[Endpoint, ...] = ()

    @classmethod
    def from_ini(cls, values: Mapping[str, Any], context: Any = None) -> DiscoverySettings:
        """From converted ini values: ``static_drivers`` as ``{cluster: "url url"}``."""
        values = dict(values)
        if "static_drivers" in values:
            values["static_drivers"] = tuple(
                (cluster, tuple(conv.aslist(urls))) for cluster, urls in values["static_drivers"].items())
        if "static_schedulers" in values:
            values["static_schedulers"] = tuple(values["static_schedulers"])
        return cls(**values)


def drivers_discovery(settings: DiscoverySettings, *, section: str | None = None) -> Discovery:
    """Where the Mesos drivers are: ZooKeeper (watched once started), or the static list — not both.

    :param section: the ini section the settings came from, for the :class:`ConfigError`.
    """
    where = f"[{section}] " if section else ""
    if settings.zookeeper_hosts:
        if settings.static_drivers:
            raise ConfigError(f"{where}set zookeeper_hosts or static_drivers, not both")
        from .zookeeper import ZookeeperDiscovery  # kazoo stays optional

        return ZookeeperDiscovery(settings.zookeeper_hosts, root=settings.zookeeper_root,
                                  timeout=settings.zookeeper_timeout)
    try:
        drivers = {cluster: [Endpoint.from_url(url, cluster=cluster) for url in urls]
                   for cluster, urls in settings.static_drivers}
    except ValueError as exc:
        raise ConfigError(f"{where}bad value for 'static_drivers': {exc}") from None
    return StaticDiscovery(drivers)
