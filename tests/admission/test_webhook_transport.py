"""Webhook calls over the gateway's one outbound transport: causes, breaker, TLS, pooling.

Real HTTPS webhooks (``Hook``, werkzeug over TLS with a trustme certificate) and raw
sockets; the client is :class:`WebhookClient` on a :class:`PooledTransport`, as the
gateway builds it.
"""

from __future__ import annotations

import http.server
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trustme

from bcs_middleware.admission.client import CircuitBreaker, WebhookClient
from bcs_middleware.admission.definitions import ClientConfig
from bcs_middleware.admission.webhook_failure import WebhookCallError
from bcs_middleware.outbound.addresses import AddressPolicy
from bcs_middleware.outbound.transport import PooledTransport
from tests.support.servers import TrapListener

from .conftest import Hook, review_answer

BODY = b'{"request": {"uid": "1"}}'


def _client(transport: PooledTransport, *pairs: tuple[str, str], threshold: int = 5) -> WebhookClient:
    return WebhookClient(transport=transport, address_map=dict(pairs), breaker=CircuitBreaker(threshold, 30.0))


def _config(ca: trustme.CA | None, service: str = "hook-a.webhooks") -> ClientConfig:
    name, namespace = service.split(".")
    return ClientConfig(ca_pem=ca.cert_pem.bytes().decode() if ca else None,
                        service_name=name, service_namespace=namespace)


@pytest.fixture
def silent() -> Iterator[TrapListener]:
    listener = TrapListener(hold=True)
    yield listener
    listener.close()


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return int(sock.getsockname()[1])


def _post(client: WebhookClient, config: ClientConfig, timeout: float = 2.0, key: str = "k") -> bytes:
    return client.post(client.target(config), BODY, timeout, breaker_key=key)


def test_a_refused_port_is_a_connect_failure_not_a_timeout(ca: trustme.CA) -> None:
    client = _client(PooledTransport(), ("hook-a.webhooks", f"127.0.0.1:{_closed_port()}"))
    started = time.monotonic()
    with pytest.raises(WebhookCallError) as info:
        _post(client, _config(ca), timeout=5.0)
    assert info.value.cause == "connect"
    assert "refused" in info.value.detail
    assert time.monotonic() - started < 2.0  # answered at once, not after the timeout


def test_a_webhook_that_never_answers_is_a_timeout(ca: trustme.CA, silent: TrapListener) -> None:
    client = _client(PooledTransport(), ("hook-a.webhooks", f"127.0.0.1:{silent.port}"))
    started = time.monotonic()
    with pytest.raises(WebhookCallError) as info:
        _post(client, _config(ca), timeout=0.5)
    assert info.value.cause == "timeout"
    assert 0.4 < time.monotonic() - started < 3.0
    assert silent.accepted == 1


def test_the_breaker_opens_after_repeated_failures_and_then_calls_nothing(ca: trustme.CA, silent: TrapListener) -> None:
    client = _client(PooledTransport(), ("hook-a.webhooks", f"127.0.0.1:{silent.port}"), threshold=2)
    for _ in range(2):
        with pytest.raises(WebhookCallError) as info:
            _post(client, _config(ca), timeout=0.3)
        assert info.value.cause == "timeout"
    with pytest.raises(WebhookCallError) as info:
        _post(client, _config(ca), timeout=0.3)
    assert info.value.cause == "circuit_open"
    assert silent.accepted == 2


def test_the_ca_bundle_is_what_the_certificate_must_chain_to(
    hooks: Callable[[Any], Hook], other_ca: trustme.CA
) -> None:
    hook = hooks(lambda body: review_answer(body))
    client = _client(PooledTransport(), ("hook-a.webhooks", hook.address))
    with pytest.raises(WebhookCallError) as info:
        _post(client, _config(other_ca))
    assert info.value.cause == "tls"
    assert hook.calls == 0


def test_the_certificate_must_name_the_service(hooks: Callable[[Any], Hook], ca: trustme.CA) -> None:
    hook = hooks(lambda body: review_answer(body))
    client = _client(PooledTransport(), ("not-named.webhooks", hook.address))
    with pytest.raises(WebhookCallError) as info:
        _post(client, _config(ca, "not-named.webhooks"))
    assert (info.value.cause, info.value.detail) == ("tls", "certificate does not match the webhook host name")
    assert hook.calls == 0


class KeepAliveHook:
    """An HTTPS webhook that keeps connections alive (werkzeug's server closes each one);
    ``connections`` counts the connections it accepted, ``calls`` the requests."""

    def __init__(self, cert: trustme.LeafCert) -> None:
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hook.calls += 1
                payload = json.dumps(review_answer({"request": {"uid": "1"}})).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def get_request(self) -> tuple[socket.socket, Any]:
                conn, peer = super().get_request()
                hook.connections += 1
                return context.wrap_socket(conn, server_side=True), peer

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(context)
        self.calls = 0
        self.connections = 0
        self.server = Server(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_calls_reuse_pooled_connections(server_cert: trustme.LeafCert, ca: trustme.CA) -> None:
    hook = KeepAliveHook(server_cert)
    transport = PooledTransport()
    try:
        client = _client(transport, ("hook-a.webhooks", hook.address))
        for _ in range(20):
            assert b'"allowed"' in _post(client, _config(ca))
        assert hook.calls == 20
        assert hook.connections == 1  # one connection at the webhook for twenty calls
        assert transport.connections_opened == 1
    finally:
        transport.close()
        hook.stop()


def test_an_oversized_answer_is_malformed_and_its_connection_not_reused(
    hooks: Callable[[Any], Hook], ca: trustme.CA
) -> None:
    hook = hooks(lambda body: b"x" * 4096)
    transport = PooledTransport()
    client = WebhookClient(transport=transport, address_map={"hook-a.webhooks": hook.address}, max_response=1024)
    for _ in range(2):
        with pytest.raises(WebhookCallError) as info:
            _post(client, _config(ca))
        assert info.value.cause == "malformed"
    assert transport.connections_opened == 2


def test_the_address_policy_applies_to_webhooks(hooks: Callable[[Any], Hook], ca: trustme.CA) -> None:
    hook = hooks(lambda body: review_answer(body))
    transport = PooledTransport(address_policy=AddressPolicy(deny=["127.0.0.1/32"]))
    client = _client(transport, ("hook-a.webhooks", hook.address))
    with pytest.raises(WebhookCallError) as info:
        _post(client, _config(ca))
    assert (info.value.cause, info.value.detail) == ("connect", "the gateway does not connect to this address")
    assert hook.calls == 0 and transport.connections_opened == 0


def test_a_url_webhook_is_posted_to_its_path_and_query(hooks: Callable[[Any], Hook], ca: trustme.CA) -> None:
    seen: list[str] = []
    hook = hooks(lambda body: review_answer(body))
    app = hook._app

    def recording(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        seen.append(f"{environ['PATH_INFO']}?{environ['QUERY_STRING']}")
        return app(environ, start_response)

    hook.server.app = recording
    client = _client(PooledTransport())
    config = ClientConfig(ca_pem=ca.cert_pem.bytes().decode(), url=f"https://localhost:{hook.port}/admit?x=1")
    assert b'"allowed"' in _post(client, config)
    assert seen == ["/admit?x=1"]
