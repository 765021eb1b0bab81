"""ZooKeeper, fake schedulers/drivers, registrars and an in-process gateway route for Mesos tests."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from werkzeug.serving import make_server

from bcs_middleware.apps.proxy import UpstreamProxy
from bcs_middleware.core import environ as env
from bcs_middleware.discovery.base import DEFAULT_ROOT, Endpoint
from bcs_middleware.discovery.registration import Registrar
from bcs_middleware.layers.mesos_route import MesosRoutingMiddleware
from tests.support.fake_scheduler import FakeScheduler
from tests.support.zookeeper import ZookeeperServer, available

SESSION_TIMEOUT = 2.0  # seconds; the test ZooKeeper grants 0.4 to 20 s
SCHEDULERS = f"{DEFAULT_ROOT}/scheduler"


def _need_zookeeper() -> None:
    if not available():
        pytest.skip("ZooKeeper (Debian package 'zookeeper') and java are needed")


@pytest.fixture(scope="session")
def zookeeper() -> Iterator[ZookeeperServer]:
    """One ZooKeeper for the whole session; tests use their own cluster ids / roots."""
    _need_zookeeper()
    server = ZookeeperServer()
    server.start()
    yield server
    server.remove()


@pytest.fixture
def private_zookeeper() -> Iterator[ZookeeperServer]:
    """A ZooKeeper of this test only (it may stop and restart it)."""
    _need_zookeeper()
    server = ZookeeperServer()
    server.start()
    yield server
    server.remove()


@pytest.fixture
def fakes() -> Iterator[Callable[[str], FakeScheduler]]:
    started: list[FakeScheduler] = []

    def start(name: str, **kwargs: Any) -> FakeScheduler:
        fake = FakeScheduler(name, **kwargs)
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.stop()


@pytest.fixture
def registrars() -> Iterator[Callable[..., Registrar]]:
    """``register(hosts, path, fake_or_endpoint)`` → a registered :class:`Registrar`."""
    started: list[Registrar] = []

    def register(hosts: str, path: str, target: FakeScheduler | Endpoint, **kwargs: Any) -> Registrar:
        endpoint = target if isinstance(target, Endpoint) else Endpoint(
            ip="127.0.0.1", port=target.port, scheme=target.scheme, version="test",
            cluster=path.rsplit("/", 1)[-1], hostname=target.name)
        registrar = Registrar(hosts, path, endpoint, timeout=SESSION_TIMEOUT, **kwargs)
        assert registrar.register(wait=10), f"could not register under {path}"
        started.append(registrar)
        return registrar

    yield register
    for registrar in started:
        registrar.deregister()


class UserLayer:
    """Stands in for the token auth layer: any request is user ``alice``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("HTTP_X_TEST_ANONYMOUS") is None:
            environ[env.USER] = env.User(1, "alice")
        return self.app(environ, start_response)


class Served:
    """A WSGI app on a real loopback socket in a thread."""

    def __init__(self, app: Any) -> None:
        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gateway_route() -> Iterator[Callable[..., tuple[Served, MesosRoutingMiddleware]]]:
    """``route(discovery, **options)`` → a served gateway Mesos route (user layer → routing → proxy)."""
    served: list[tuple[Served, UpstreamProxy]] = []

    def make(discovery: Any, **options: Any) -> tuple[Served, MesosRoutingMiddleware]:
        proxy = UpstreamProxy(connect_timeout=2, read_timeout=10)
        layer = MesosRoutingMiddleware(proxy, discovery=discovery, **options)
        server = Served(UserLayer(layer))
        served.append((server, proxy))
        return server, layer

    yield make
    for server, proxy in served:
        server.stop()
        proxy.transport.close()


def mesos_get(base: str, uri: str, cluster: str | None, **kwargs: Any) -> requests.Response:
    headers = {"BCS-ClusterID": cluster} if cluster else {}
    headers.update(kwargs.pop("headers", {}))
    return requests.get(f"{base}/bcsapi/v4/scheduler/mesos/{uri}", headers=headers, timeout=15, **kwargs)


def served_by(response: requests.Response) -> str:
    assert response.status_code == 200, response.text
    return str(json.loads(response.content)["served_by"])


