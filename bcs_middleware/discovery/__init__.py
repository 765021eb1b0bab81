"""Service discovery: where Mesos drivers and schedulers are.

:class:`StaticDiscovery` (configuration, the embedded default) and
:class:`~bcs_middleware.discovery.zookeeper.ZookeeperDiscovery` (the source
system's ZooKeeper layout; imported lazily so kazoo stays optional) implement
the same :class:`Discovery` protocol.
"""

from __future__ import annotations

from .base import APISERVER_DIR, DEFAULT_ROOT, DRIVER_DIR, SCHEDULER_DIR, Discovery, Endpoint, node_sequence
from .static import StaticDiscovery

__all__ = [
    "APISERVER_DIR",
    "DEFAULT_ROOT",
    "DRIVER_DIR",
    "SCHEDULER_DIR",
    "Discovery",
    "Endpoint",
    "StaticDiscovery",
    "node_sequence",
]
