"""The request is classified once, by the first layer, and read by every layer inside.

Through the whole gateway pipeline (request context, audit, agent tunnel endpoint, token
auth, the dispatcher, routing, admission, the proxy) to a real HTTPS apiserver, each
request is classified exactly once; and a layer loaded by itself from a PasteDeploy ini
classifies on demand, with the same refusals.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from paste.deploy import loadapp
from werkzeug.test import Client

from bcs_middleware.compose.bootstrap import BootstrapUser
from bcs_middleware.compose.config import AuditSettings, AuthSettings, GatewayConfig
from bcs_middleware.compose.gateway import build_gateway
from bcs_middleware.core import environ as env
from bcs_middleware.core import facts
from bcs_middleware.outbound.transport import PooledTransport
from bcs_middleware.store.crypto import token_digest
from bcs_middleware.store.sql import open_store
from tests.support.fake_apiserver import FakeAPIServer

ADMIN = "admin-token-for-facts-0123456789abcdefghijk"
SA_TOKEN = "sa-token-for-facts"


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=SA_TOKEN) as api:
        yield api


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths classified, one entry per call of :func:`facts.classify`."""
    seen: list[str] = []
    classify = facts.classify

    def counting(environ: dict[str, Any]) -> facts.RequestFacts:
        seen.append(environ.get("PATH_INFO", ""))
        return classify(environ)

    monkeypatch.setattr(facts, "classify", counting)
    return seen


@pytest.mark.parametrize("method, path, status", [
    pytest.param("GET", "/tunnels/clusters/BCS-K8S-F/api/v1/namespaces/default/pods", 200, id="tunnel-list"),
    pytest.param("POST", "/tunnels/clusters/BCS-K8S-F/api/v1/namespaces/default/configmaps", 201,
                 id="tunnel-create-admitted"),
    pytest.param("GET", "/tunnels/clusters/BCS-K8S-F/api/../../rest/users/", 400, id="tunnel-refused"),
    pytest.param("GET", "/tunnels/clusters/nope/version", 404, id="tunnel-unknown-cluster"),
    pytest.param("GET", "/rest/users/admin", 200, id="management"),
    pytest.param("PUT", "/rest/clusters/BCS-K8S-F/credentials", 400, id="agent-report"),
    pytest.param("GET", "/healthz", 200, id="health"),
    pytest.param("GET", "/nowhere", 404, id="no-route"),
])
def test_each_request_is_classified_once_through_the_gateway(
    apiserver: FakeAPIServer, tmp_path: Path, counted: list[str], method: str, path: str, status: int,
) -> None:
    store = open_store("sqlite://", secret_key=Fernet.generate_key().decode())
    store.create_cluster("BCS-K8S-F", project_id="p", cluster_type="k8s")
    store.put_credentials("BCS-K8S-F", server_addresses=[apiserver.url], cacert_pem=apiserver.ca_pem,
                          user_token=SA_TOKEN)
    transport = PooledTransport()
    config = GatewayConfig(auth=AuthSettings(bootstrap_users=(BootstrapUser("admin", token_digest(ADMIN)),)),
                           audit=AuditSettings(log="-"))  # audited to standard output
    app = build_gateway(config, store=store, transport=transport, background=False)
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "facts", "namespace": "default"}}) if method == "POST" else None
    headers = {"Content-Type": "application/json"}
    if method != "PUT":
        headers["Authorization"] = f"Bearer {ADMIN}"
    try:
        response = Client(app).open(path, method=method, data=body or ("{}" if method == "PUT" else None),
                                    headers=headers)
        assert response.status_code == status, response.data
        response.close()
    finally:
        transport.close()
    assert counted == [path]


def test_a_layer_used_alone_classifies_on_demand(tmp_path: Path, counted: list[str]) -> None:
    """``cluster_routing`` loaded by itself from an ini (no request context in front)."""
    url = f"sqlite:///{tmp_path / 'alone.db'}"
    key = Fernet.generate_key().decode()
    store = open_store(url, secret_key=key)
    store.create_cluster("BCS-K8S-A", project_id="p", cluster_type="k8s")
    store.put_credentials("BCS-K8S-A", server_addresses=["https://127.0.0.1:1"], cacert_pem=None,
                          user_token=SA_TOKEN)
    ini = tmp_path / "alone.ini"
    ini.write_text(textwrap.dedent(f"""
        [pipeline:main]
        pipeline = cluster_routing seen

        [filter:cluster_routing]
        use = egg:bcs-middleware#cluster_routing
        database_url = {url}
        secret_key = {key}

        [app:seen]
        paste.app_factory = tests.layers.test_facts_once:seen_app_factory
    """))
    app = loadapp(f"config:{ini}")
    user = env.User(1, "admin", is_superuser=True)
    client = Client(app)
    ok = client.get("/tunnels/clusters/BCS-K8S-A//api/v1/pods", environ_overrides={env.USER: user})
    assert ok.status_code == 200 and ok.get_json() == {"cluster": "BCS-K8S-A", "path": "/api/v1/pods"}
    refused = client.get("/tunnels/clusters/BCS-K8S-A/api/../../x", environ_overrides={env.USER: user})
    assert refused.status_code == 400 and refused.get_json()["reason"] == "BadRequest"
    assert refused.get_json()["kind"] == "Status"
    passed = client.get("/elsewhere")
    assert passed.status_code == 200 and passed.get_json() == {"cluster": None, "path": "/elsewhere"}
    assert counted == ["/tunnels/clusters/BCS-K8S-A//api/v1/pods", "/tunnels/clusters/BCS-K8S-A/api/../../x",
                       "/elsewhere"]


def seen_app_factory(global_conf: dict[str, Any], **local_conf: Any) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        upstream = env.get_upstream(environ)
        body = json.dumps({"cluster": upstream.name.removeprefix("cluster:") if upstream else None,
                           "path": upstream.path if upstream else environ["PATH_INFO"]}).encode()
        start_response("200 OK", [("Content-Type", "application/json")])
        return [body]

    return app
