from __future__ import annotations

import logging

import pytest
import trustme
from cryptography.fernet import Fernet
from werkzeug.test import Client

from bcs_middleware.compose.bootstrap import BootstrapUser
from bcs_middleware.compose.config import AuthSettings, ClusterSettings, GatewayConfig, ServerSettings, StoreSettings
from bcs_middleware.compose.gateway import build_gateway
from bcs_middleware.store.crypto import token_digest
from bcs_middleware.store.sql import open_store

ADMIN_TOKEN = "admin-token-for-tests-0123456789abcdefghijkl"


class API:
    """A werkzeug test client with the admin token and JSON helpers."""

    def __init__(self, app, store, tokens: list[str]) -> None:  # type: ignore[no-untyped-def]
        self.client = Client(app)
        self.store = store
        self.tokens = tokens  # every token value the test saw, for log-hygiene checks

    def call(self, method: str, path: str, *, token: str | None = ADMIN_TOKEN, json=None,  # type: ignore[no-untyped-def]
             data=None, headers=None, **kw):
        hdrs = dict(headers or {})
        if token is not None:
            hdrs["Authorization"] = f"Bearer {token}"
        return self.client.open(path, method=method, json=json, data=data, headers=hdrs, **kw)

    def new_user(self, name: str) -> tuple[int, str]:
        user = self.call("POST", "/rest/users/", json={"user_name": name}).get_json()
        token = self.call("POST", f"/rest/users/{user['id']}/tokens").get_json()["user_token"]
        self.tokens.append(token)
        return user["id"], token


@pytest.fixture(scope="session")
def gateway_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def api(migrated_database_url, gateway_ca, tmp_path, caplog):  # type: ignore[no-untyped-def]
    database_url = migrated_database_url
    caplog.set_level(logging.DEBUG)
    ca_file = tmp_path / "ca.crt"
    cert_file = tmp_path / "server.crt"
    gateway_ca.cert_pem.write_to_path(str(ca_file))
    gateway_ca.issue_cert("localhost", "127.0.0.1").cert_chain_pems[0].write_to_path(str(cert_file))
    store = open_store(database_url, secret_key=Fernet.generate_key().decode())
    config = GatewayConfig(
        store=StoreSettings(database_url=database_url),
        auth=AuthSettings(bootstrap_users=(BootstrapUser("admin", token_digest(ADMIN_TOKEN)),), token_cache_ttl=0),
        clusters=ClusterSettings(cache_ttl=0),
        server=ServerSettings(gateway_ca_file=ca_file, gateway_cert_file=cert_file, max_body=64 * 1024),
    )
    client = API(build_gateway(config, store=store, background=False), store, [ADMIN_TOKEN])
    yield client
    # No token value may appear in anything the code under test logged.
    for record in caplog.records:
        text = record.getMessage()
        for token in client.tokens:
            assert token not in text, f"a token leaked into a log line: {record.name}"
    store.db.dispose()
