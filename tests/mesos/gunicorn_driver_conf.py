"""gunicorn config: register the driver in ZooKeeper once per server (master process hooks)."""

from __future__ import annotations

import os

from bcs_middleware.compose.driver import gunicorn_hooks
from bcs_middleware.discovery.base import Endpoint

when_ready, on_exit = gunicorn_hooks(
    zookeeper_hosts=os.environ["ZK_HOSTS"],
    cluster_id=os.environ["DRIVER_CLUSTER"],
    endpoint=Endpoint(ip="127.0.0.1", port=int(os.environ["DRIVER_PORT"]), version="test"),
    timeout=2.0,
)
