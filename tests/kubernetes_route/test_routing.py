"""Cluster routing details through the real gateway: failover, credentials, streaming, refusals."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import ssl
import time

import pytest

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.polling import wait_until
from tests.support.servers import free_port

from .conftest import ADMIN, CLUSTER, SA_TOKEN, Gateway


def _connection(gateway: Gateway, timeout: float = 30) -> http.client.HTTPSConnection:
    ctx = ssl.create_default_context(cafile=gateway.ca_file)
    return http.client.HTTPSConnection("localhost", gateway.server.port, context=ctx, timeout=timeout)


def _register(gateway: Gateway, cluster_id: str, addresses: list[str], ca_pem: str, token: str = SA_TOKEN) -> None:
    status, _ = gateway.call("POST", "/rest/clusters/bcs",
                             body={"id": cluster_id, "project_id": "p", "cluster_type": "k8s"})
    assert status in (201, 409)
    status, body = gateway.call("PUT", f"/rest/clusters/{cluster_id}/credentials", body={
        "server_addresses": ";".join(addresses), "cacert_data": ca_pem, "user_token": token})
    assert status == 200, body


def test_cluster_without_credentials_is_502_with_a_message_kubectl_prints(gateway: Gateway) -> None:
    # kubectl shows a text body of a 502 (its discovery drops a Status's message, and for a
    # 503 it prints only "the server is currently unable to handle the request").
    gateway.call("POST", "/rest/clusters/bcs", body={"id": "no-creds", "project_id": "p", "cluster_type": "k8s"})
    status, body = gateway.call("GET", "/tunnels/clusters/no-creds/api")
    assert status == 502 and b"has no credentials yet: its kube-agent has not reported" in body


def test_mesos_cluster_is_not_a_tunnel_target(gateway: Gateway) -> None:
    gateway.call("POST", "/rest/clusters/bcs", body={"id": "mesos-1", "project_id": "p", "cluster_type": "mesos"})
    status, body = gateway.call("GET", "/tunnels/clusters/mesos-1/api")
    assert status == 400 and json.loads(body)["kind"] == "Status"


def test_no_token_on_a_tunnel_is_a_401_status(gateway: Gateway) -> None:
    status, body = gateway.call("GET", f"/tunnels/clusters/{CLUSTER}/api", token="")
    document = json.loads(body)
    assert status == 401 and document["kind"] == "Status" and document["reason"] == "Unauthorized"


def test_failover_to_the_second_address(gateway: Gateway, apiserver: FakeAPIServer) -> None:
    dead = f"https://127.0.0.1:{free_port()}"
    _register(gateway, "failover-1", [dead, apiserver.url], apiserver.ca_pem)
    for _ in range(3):
        status, body = gateway.call("GET", "/tunnels/clusters/failover-1/version")
        assert status == 200 and json.loads(body)["major"] == "1"


def test_all_addresses_down_is_a_gateway_error(gateway: Gateway, apiserver: FakeAPIServer) -> None:
    _register(gateway, "down-1", [f"https://127.0.0.1:{free_port()}"], apiserver.ca_pem)
    status, body = gateway.call("GET", "/tunnels/clusters/down-1/version")
    assert status in (502, 503) and json.loads(body)["kind"] == "Status"


def test_wrong_cluster_ca_is_refused(gateway: Gateway, apiserver: FakeAPIServer) -> None:
    import trustme

    _register(gateway, "wrong-ca", [apiserver.url], trustme.CA().cert_pem.bytes().decode())
    status, body = gateway.call("GET", "/tunnels/clusters/wrong-ca/version")
    document = json.loads(body)
    assert status == 502 and "certificate" in document["message"]
    assert SA_TOKEN not in body.decode()


def test_new_credentials_take_effect_within_the_cache_bound(gateway: Gateway, apiserver: FakeAPIServer) -> None:
    _register(gateway, "rotating", [apiserver.url], apiserver.ca_pem, token="stale-token")
    assert gateway.call("GET", "/tunnels/clusters/rotating/api")[0] == 401  # the apiserver refuses it
    _register(gateway, "rotating", [apiserver.url], apiserver.ca_pem, token=SA_TOKEN)
    # 5 s cache bound per worker, with margin
    assert wait_until(lambda: gateway.call("GET", "/tunnels/clusters/rotating/api")[0] == 200, 15, step=0.25), \
        "new credentials not used within the cache bound"


def test_chunked_upload_arrives_intact(gateway: Gateway) -> None:
    payload = os.urandom(3 * 1024 * 1024 + 17)
    conn = _connection(gateway)
    conn.putrequest("POST", f"/tunnels/clusters/{CLUSTER}/__digest")
    conn.putheader("Authorization", f"Bearer {ADMIN}")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for i in range(0, len(payload), 100_000):
        piece = payload[i:i + 100_000]
        conn.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
    conn.send(b"0\r\n\r\n")
    resp = conn.getresponse()
    result = json.loads(resp.read())
    conn.close()
    assert resp.status == 200
    assert result == {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}


def test_100_mb_upload_arrives_intact(gateway: Gateway) -> None:
    block = os.urandom(1024 * 1024)
    total = 100
    digest = hashlib.sha256()
    for _ in range(total):
        digest.update(block)
    conn = _connection(gateway, timeout=120)
    conn.putrequest("POST", f"/tunnels/clusters/{CLUSTER}/__digest")
    conn.putheader("Authorization", f"Bearer {ADMIN}")
    conn.putheader("Content-Length", str(total * len(block)))
    conn.endheaders()
    for _ in range(total):
        conn.send(block)
    resp = conn.getresponse()
    result = json.loads(resp.read())
    conn.close()
    assert result == {"bytes": total * len(block), "sha256": digest.hexdigest()}


def test_client_leaving_mid_watch_frees_the_upstream(gateway: Gateway, apiserver: FakeAPIServer) -> None:
    before = apiserver.open_watches
    raw = socket.create_connection(("127.0.0.1", gateway.server.port), timeout=10)
    sock = ssl.create_default_context(cafile=gateway.ca_file).wrap_socket(raw, server_hostname="localhost")
    sock.sendall(
        f"GET /tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods?watch=true HTTP/1.1\r\n"
        f"Host: localhost\r\nAuthorization: Bearer {ADMIN}\r\n\r\n".encode()
    )
    head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 200")
    assert wait_until(lambda: apiserver.open_watches > before, 10)
    sock.close()

    def upstream_closed() -> bool:  # events keep the proxy writing, so it notices the closed client
        if apiserver.open_watches <= before:
            return True
        name = f"tick-{time.time_ns()}"
        apiserver.store.create("configmaps", {"metadata": {"name": name, "namespace": "default"}})
        apiserver.store.create("pods", {"metadata": {"name": name, "namespace": "default"},
                                        "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
        return False

    assert wait_until(upstream_closed, 20, step=0.2), "the upstream watch stayed open after the client left"


@pytest.mark.parametrize("server_name", ["kubernetes"])
def test_tls_server_name_override(apiserver: FakeAPIServer, server_name: str) -> None:
    """Addresses by IP not in the certificate verify against the configured name."""
    from cryptography.fernet import Fernet
    from werkzeug.test import Client

    from bcs_middleware.compose.bootstrap import BootstrapUser
    from bcs_middleware.compose.config import AuthSettings, ClusterSettings, GatewayConfig
    from bcs_middleware.compose.gateway import build_gateway
    from bcs_middleware.outbound.transport import PooledTransport
    from bcs_middleware.store.crypto import token_digest
    from bcs_middleware.store.sql import open_store

    key = Fernet.generate_key().decode()
    store = open_store("sqlite://", secret_key=key)
    store.create_cluster("named", project_id="p", cluster_type="k8s")
    # "localhost" is in the certificate but we pretend it is not by forcing "kubernetes".
    store.put_credentials("named", server_addresses=[f"https://localhost:{apiserver.port}"],
                          cacert_pem=apiserver.ca_pem, user_token=SA_TOKEN)
    users = (BootstrapUser("admin", token_digest(ADMIN)),)
    for name, expected in ((server_name, 200), ("not-in-the-cert.example", 502)):
        transport = PooledTransport()
        config = GatewayConfig(auth=AuthSettings(bootstrap_users=users), clusters=ClusterSettings(tls_server_name=name))
        app = build_gateway(config, store=store, transport=transport, background=False)
        response = Client(app).get("/tunnels/clusters/named/version", headers={"Authorization": f"Bearer {ADMIN}"})
        assert response.status_code == expected, response.data
        response.close()
        transport.close()
