"""Service discovery: where Mesos drivers and schedulers are.

:class:`StaticDiscovery` (configuration, the embedded default) and
:class:`~bcs_middleware.discovery.zookeeper.ZookeeperDiscovery` (the source
system's ZooKeeper layout; imported lazily so kazoo stays optional) implement
the same :class:`Discovery` protocol.
"""
