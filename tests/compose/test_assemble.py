"""The gateway's three steps apart: assemble wires without I/O; start runs once, when serving.

Everything here is in process and opens no socket: the resources are fakes (a scripted
transport, a static discovery, a recording RBAC runner) over an in-memory SQLite store.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from cryptography.fernet import Fernet
from werkzeug.test import Client

from bcs_middleware.agent_tunnel.registry import LocalAgents, LocalOnlyDialer
from bcs_middleware.compose import start as start_module
from bcs_middleware.compose.bootstrap import BootstrapUser
from bcs_middleware.compose.config import AgentTunnelSettings, AuthSettings, GatewayConfig, RBACSettings
from bcs_middleware.compose.gateway import assemble, build_gateway
from bcs_middleware.compose.resources import GatewayResources, prepare_database
from bcs_middleware.compose.start import StartOnFirstRequest, start_when_serving
from bcs_middleware.core import worker_start
from bcs_middleware.core.records import Holder
from bcs_middleware.core.worker_start import worker_started
from bcs_middleware.discovery.static import StaticDiscovery
from bcs_middleware.outbound.addresses import AddressPolicy
from bcs_middleware.serving.hooks import build_in_master
from bcs_middleware.store.crypto import token_digest
from bcs_middleware.store.sql import SQLStore, open_store

ADMIN = "admin-token-" + "a" * 40
CLUSTER = "BCS-K8S-A1"
SA_TOKEN = "sa-token-of-the-cluster"


class CannedResponse:
    """An upstream answer with a JSON body, as the transport's ``Response`` protocol reads it."""

    def __init__(self, body: dict[str, Any]) -> None:
        self._body = json.dumps(body).encode()
        self.status, self.reason = 200, "OK"
        self.headers = [("Content-Type", "application/json"), ("Content-Length", str(len(self._body)))]
        self.end_to_end_headers = list(self.headers)
        self.length_remaining: int | None = len(self._body)

    def read1(self, amt: int) -> bytes:
        chunk, self._body = self._body[:amt], self._body[amt:]
        self.length_remaining = len(self._body)
        return chunk

    def read(self) -> bytes:
        return self.read1(len(self._body))

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class ScriptedTransport:
    """A transport that records what it was asked to send and answers ``{"sent": "yes"}``."""

    sent: list[tuple[Any, str, list[tuple[str, str]]]] = field(default_factory=list)

    def send(self, upstream: Any, method: str, headers: list[tuple[str, str]], body: Any,
             content_length: int | None, *, timeout: float | None = None) -> CannedResponse:
        self.sent.append((upstream, method, list(headers)))
        return CannedResponse({"sent": "yes"})

    def close(self) -> None:
        pass


class RecordingRunner:
    """Stands in for the RBAC service: counts starts and stops."""

    def __init__(self) -> None:
        self.starts = 0
        self.stops: list[float] = []

    def start(self) -> None:
        self.starts += 1

    def stop(self, wait: float) -> None:
        self.stops.append(wait)


class StartableDiscovery(StaticDiscovery):
    """A static discovery that counts how often it was asked to start watching."""

    starts = 0

    def start(self) -> None:
        self.starts += 1


@pytest.fixture(autouse=True)
def own_worker_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """What earlier tests of this process left to start at worker start is not this test's."""
    monkeypatch.setattr(worker_start, "_AT_WORKER_START", [])


@pytest.fixture
def store() -> Iterator[SQLStore]:
    store = open_store("sqlite://", secret_key=Fernet.generate_key().decode())
    store.create_cluster(CLUSTER, project_id="p", cluster_type="k8s")
    store.put_credentials(CLUSTER, server_addresses=["https://apiserver.test:6443"], cacert_pem=None,
                          user_token=SA_TOKEN)
    yield store
    store.db.dispose()


def fake_resources(store: SQLStore, **changes: Any) -> GatewayResources:
    agents = LocalAgents(holder=Holder("test/1"), placements=None)
    resources = GatewayResources(store=store, transport=ScriptedTransport(), address_policy=AddressPolicy(),
                                 agents=agents, tunnels=LocalOnlyDialer(agents), discovery=StartableDiscovery())
    return replace(resources, **changes)


CONFIG = GatewayConfig(auth=AuthSettings(bootstrap_users=(BootstrapUser("admin", token_digest(ADMIN)),)))


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any socket made from here on fails the test."""

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("assemble opened a socket")

    monkeypatch.setattr(socket, "socket", refused)
    monkeypatch.setattr(socket, "create_connection", refused)


def test_assemble_opens_no_socket_and_starts_no_thread(store: SQLStore, no_network: None) -> None:
    resources = fake_resources(store, rbac=RecordingRunner())
    threads = threading.active_count()
    app = assemble(CONFIG, resources)
    assert threading.active_count() == threads
    assert resources.rbac.starts == 0 and resources.discovery.starts == 0  # type: ignore[union-attr]
    assert callable(app)


def test_an_assembled_gateway_serves_from_its_resources(store: SQLStore, no_network: None) -> None:
    prepare_database(store, CONFIG, fake_resources(store).certificates)  # the bootstrap admin
    resources = fake_resources(store)
    client = Client(assemble(CONFIG, resources))
    auth = {"Authorization": f"Bearer {ADMIN}"}
    assert client.get("/rest/users/admin", headers=auth).json["name"] == "admin"  # type: ignore[index]
    response = client.get(f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces", headers=auth)
    assert response.status_code == 200 and response.json == {"sent": "yes"}
    ((upstream, method, headers),) = resources.transport.sent  # type: ignore[attr-defined]
    assert method == "GET" and upstream.base_urls == ("https://apiserver.test:6443",)
    assert upstream.path == "/api/v1/namespaces"
    # The cluster's credential goes upstream, never the client's token.
    assert upstream.bearer_token == SA_TOKEN
    assert ADMIN not in repr(headers)
    assert client.get(f"/tunnels/clusters/{CLUSTER}/api", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_start_runs_once_when_the_worker_starts(store: SQLStore) -> None:
    resources = fake_resources(store, rbac=RecordingRunner(), peer_address=None)
    app = start_when_serving(assemble(CONFIG, resources), resources)
    worker_started(None)  # the gateway's post_worker_init hook
    Client(app).get("/healthz")
    worker_started(None)
    assert resources.rbac.starts == 1 and resources.discovery.starts == 1  # type: ignore[union-attr]
    # The serving process holds the agents, whoever built the application.
    assert resources.agents.holder.id == f"{socket.gethostname()}/{os.getpid()}"


def test_start_runs_once_on_the_first_request_without_the_hooks(store: SQLStore) -> None:
    resources = fake_resources(store, rbac=RecordingRunner(), peer_address=None)
    app = start_when_serving(assemble(CONFIG, resources), resources)
    assert resources.rbac.starts == 0  # type: ignore[union-attr]
    barrier = threading.Barrier(8)

    def request() -> None:
        barrier.wait()
        Client(app).get("/healthz")

    threads = [threading.Thread(target=request) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert resources.rbac.starts == 1 and resources.discovery.starts == 1  # type: ignore[union-attr]
    worker_started(None)
    assert resources.rbac.starts == 1  # type: ignore[union-attr]


def test_the_master_check_build_starts_nothing_in_the_workers(store: SQLStore) -> None:
    resources = fake_resources(store, rbac=RecordingRunner(), peer_address=None)
    kept: list[Any] = []
    build_in_master(lambda: kept.append(start_when_serving(assemble(CONFIG, resources), resources)))
    worker_started(None)  # a worker forked from that master
    assert resources.rbac.starts == 0 and resources.discovery.starts == 0  # type: ignore[union-attr]


def test_the_rbac_lease_is_handed_over_at_exit(store: SQLStore, monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[tuple[Any, tuple[Any, ...]]] = []
    monkeypatch.setattr(start_module.atexit, "register", lambda fn, *args: registered.append((fn, args)))
    resources = fake_resources(store, rbac=RecordingRunner(), peer_address=None)
    app = start_when_serving(assemble(CONFIG, resources), resources)
    Client(app).get("/healthz")
    assert (resources.agents.close, ()) in registered
    assert (resources.rbac.stop, (start_module.RBAC_EXIT_WAIT,)) in registered  # type: ignore[union-attr]


def test_build_gateway_without_background_leaves_nothing_to_start(store: SQLStore) -> None:
    config = replace(CONFIG, rbac=RBACSettings(enabled=False), agent_tunnel=AgentTunnelSettings(peer_address=None))
    app = build_gateway(config, store=store, transport=ScriptedTransport(), background=False)
    assert not isinstance(app, StartOnFirstRequest)
    assert build_gateway(config, store=store, transport=ScriptedTransport()).start.started is False
