"""The HTTP permission source: ETags, bearer token, verified TLS, bounded answers."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trustme

from bcs_middleware.rbac.model import PermissionsError
from bcs_middleware.rbac.service import RBACService
from bcs_middleware.rbac.sources import HTTPSource, SourceError
from bcs_middleware.store.sql import SQLStore
from tests.support.fake_apiserver import FakeAPIServer

from .conftest import add_cluster, binding_names, run_once, writes

TOKEN = "auth-system-subscription-token-0123456789"


class AuthSystem:
    """A tiny HTTPS permission endpoint: bearer-checked, ETag-versioned."""

    def __init__(self, ca: trustme.CA) -> None:
        self.document: bytes = b""
        self.version = 0
        self.seen: list[tuple[str | None, str | None, int]] = []  # (authorization, if-none-match, status)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                auth = self.headers.get("Authorization")
                inm = self.headers.get("If-None-Match")
                etag = f'"v{owner.version}"'
                if auth != f"Bearer {TOKEN}":
                    status, body = 401, b'{"message": "unauthorized"}'
                elif inm == etag:
                    status, body = 304, b""
                else:
                    status, body = 200, owner.document
                owner.seen.append((auth, inm, status))
                self.send_response(status)
                self.send_header("ETag", etag)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.issue_cert("127.0.0.1").configure_cert(context)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/rbac/permissions"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()

    def publish(self, grants: list[dict[str, Any]] | None = None, *, raw: bytes | None = None) -> None:
        self.document = raw if raw is not None else json.dumps({"version": 1, "grants": grants or []}).encode()
        self.version += 1

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def auth_system(ca: trustme.CA) -> Iterator[AuthSystem]:
    server = AuthSystem(ca)
    yield server
    server.stop()


@pytest.fixture
def source_factory(ca: trustme.CA, auth_system: AuthSystem, tmp_path: Path) -> Iterator[Callable[..., HTTPSource]]:
    ca_file = tmp_path / "auth-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    made: list[HTTPSource] = []

    def make(**kw: Any) -> HTTPSource:
        options: dict[str, Any] = {"token_file": token_file, "ca_file": ca_file, "poll_interval": 0.0,
                                   "timeout": 5.0}
        options.update(kw)
        source = HTTPSource(options.pop("url", auth_system.url), **options)
        made.append(source)
        return source

    yield make
    for source in made:
        source.close()


def test_etag_304_means_no_reparse_and_no_reapply(
    store: SQLStore, clusters: Callable[[], FakeAPIServer], auth_system: AuthSystem,
    source_factory: Callable[..., HTTPSource],
) -> None:
    api = clusters()
    add_cluster(store, "BCS-K8S-A", url=api.url, ca_pem=api.ca_pem)
    auth_system.publish([{"user": "alice", "cluster": "*", "role": "view"}])
    source = source_factory()
    service = RBACService(store, source, tick=0.2, lease_ttl=5.0, interval=300.0, connect_timeout=1.0)
    try:
        assert run_once(service) == ["BCS-K8S-A"]
        count = writes(api)
        assert run_once(service) == []
        assert run_once(service) == []
        assert auth_system.seen[-1] == (f"Bearer {TOKEN}", '"v1"', 304) and source.not_modified == 2
        assert writes(api) == count

        auth_system.publish([{"user": "alice", "cluster": "*", "role": "edit"}])
        assert run_once(service) == ["BCS-K8S-A"]
    finally:
        service.stop()
    assert {n[2] for n in binding_names(api)} == {"bcs:alice:edit"}


def test_poll_interval_spaces_requests(auth_system: AuthSystem, source_factory: Callable[..., HTTPSource]) -> None:
    auth_system.publish([])
    source = source_factory(poll_interval=3600.0)
    assert source.poll() is not None
    assert source.poll() is None and source.fetches == 1
    assert source.poll(force=True) is None and source.fetches == 2


@pytest.mark.parametrize("change, message", [
    pytest.param({"token": "wrong-token-0123456789"}, "HTTP 401", id="wrong-token"),
    pytest.param({"ca": "other"}, "TLS certificate verification failed", id="unknown-ca"),
    pytest.param({"max_bytes": 10}, "larger than 10 bytes", id="too-large"),
    pytest.param({"url": "https://127.0.0.1:1/x"}, "connection refused", id="refused"),
])
def test_fetch_failures_are_clear_and_never_leak_the_token(
    auth_system: AuthSystem, source_factory: Callable[..., HTTPSource], tmp_path: Path,
    change: dict[str, Any], message: str,
) -> None:
    auth_system.publish([{"user": "alice", "cluster": "*", "role": "view"}])
    kw: dict[str, Any] = {}
    if "token" in change:
        (tmp_path / "wrong").write_text(change["token"])
        kw["token_file"] = tmp_path / "wrong"
    if "ca" in change:
        other = tmp_path / "other-ca.pem"
        trustme.CA().cert_pem.write_to_path(str(other))
        kw["ca_file"] = other
    if "max_bytes" in change:
        kw["max_bytes"] = change["max_bytes"]
    if "url" in change:
        kw["url"] = change["url"]
    source = source_factory(**kw)
    with pytest.raises(SourceError) as info:
        source.poll()
    assert message in str(info.value)
    assert TOKEN not in str(info.value) and "wrong-token" not in str(info.value)


def test_invalid_document_is_rejected_once(auth_system: AuthSystem, source_factory: Callable[..., HTTPSource]) -> None:
    auth_system.publish(raw=b'{"version": 1, "grants": [{"user": "a", "cluster": "*", "role": ""}]}')
    source = source_factory()
    with pytest.raises(PermissionsError, match=r"grants\.0\.role"):
        source.poll()
    assert source.poll() is None  # 304 for the same bad version: not re-parsed


@pytest.mark.parametrize("url, kw, message", [
    pytest.param("http://auth.example/rbac", {"token_file": "/x"}, "never sent over plain http", id="token-over-http"),
    pytest.param("ftp://auth.example/rbac", {}, "must be http", id="ftp"),
])
def test_unsafe_configuration_is_refused(url: str, kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HTTPSource(url, **kw)


def test_source_name_hides_url_credentials() -> None:
    source = HTTPSource("https://user:secret@auth.example:8443/rbac?key=secret2")
    assert "secret" not in source.name and source.name == "url:https://auth.example:8443/rbac"
