"""SIGTERM: the gateway stops accepting, finishes ordinary requests and ends watch streams cleanly."""

from __future__ import annotations

import signal
import socket
import ssl
import threading
import time
import urllib.request
from pathlib import Path

import trustme

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.polling import wait_until
from tests.support.servers import BIN, ConnectionServer, ServerProcess, free_port, http_get

CLI = str(BIN / "bcs-middleware")
ADMIN = "graceful-admin-token-" + "g" * 22


def test_sigterm_during_a_watch_ends_it_cleanly_and_finishes_ordinary_requests(tmp_path: Path) -> None:
    with FakeAPIServer(token="sa-graceful") as api:
        port = free_port()
        argv = [CLI, "serve", "--data-dir", str(tmp_path), "--bind", f"127.0.0.1:{port}", "--workers", "1",
                "--threads", "8", "--graceful-timeout", "20"]
        server = ServerProcess(argv, port=port, env={"BCS_ADMIN_TOKEN": ADMIN}, scheme="https", timeout=60)
        try:
            cafile = str(tmp_path / "tls" / "ca.crt")
            import json
            import urllib.request

            def call(method: str, path: str, body: dict) -> None:
                req = urllib.request.Request(f"https://localhost:{port}{path}", data=json.dumps(body).encode(),
                                             method=method, headers={"Authorization": f"Bearer {ADMIN}"})
                urllib.request.urlopen(req, timeout=20, context=ssl.create_default_context(cafile=cafile)).close()

            call("POST", "/rest/clusters/bcs", {"id": "g1", "project_id": "p", "cluster_type": "k8s"})
            call("PUT", "/rest/clusters/g1/credentials",
                 {"server_addresses": api.url, "cacert_data": api.ca_pem, "user_token": "sa-graceful"})

            raw = socket.create_connection(("127.0.0.1", port), timeout=20)
            watch = ssl.create_default_context(cafile=cafile).wrap_socket(raw, server_hostname="localhost")
            watch.sendall(f"GET /tunnels/clusters/g1/api/v1/namespaces/default/pods?watch=true HTTP/1.1\r\n"
                          f"Host: localhost\r\nAuthorization: Bearer {ADMIN}\r\n\r\n".encode())
            received = watch.recv(65536)
            while b"\r\n\r\n" not in received:
                more = watch.recv(65536)
                assert more, "no response head"
                received += more
            head, _, body = received.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")

            # An ordinary request in flight when the signal arrives still gets its answer.
            slow: dict[str, int] = {}

            def slow_request() -> None:
                status, _, _ = http_get(f"https://localhost:{port}/tunnels/clusters/g1/__slow?seconds=2",
                                        headers={"Authorization": f"Bearer {ADMIN}"}, cafile=cafile, timeout=30)
                slow["status"] = status

            thread = threading.Thread(target=slow_request)
            thread.start()
            assert wait_until(lambda: api.requests.matching("/__slow"), 10)  # in flight at the apiserver
            started = time.monotonic()
            server.signal(signal.SIGTERM)

            # The watch ends with the final chunk, well before the 20 s graceful timeout.
            # (Judged on the body alone: the head ends with a hex request id, which may end in "0".)
            while not _chunked_body_complete(body):
                chunk = watch.recv(65536)
                assert chunk, "the watch was cut instead of ended"
                body += chunk
                assert time.monotonic() - started < 10
            watch.close()
            thread.join(30)
            assert slow.get("status") == 200
            assert server.proc.wait(30) == 0
            assert time.monotonic() - started < 15
            # No new connections once it is gone.
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                refused = False
            except OSError:
                refused = True
            assert refused
            output = server.output()
            assert "ended 1 open stream(s) cleanly" in output
            # The access log (written by a background thread) was flushed before the worker left.
            lines = [json.loads(line) for line in output.splitlines() if line.startswith('{"time"')]
            paths = {line["path"]: line["status"] for line in lines}
            assert paths["/tunnels/clusters/g1/__slow"] == 200 and paths["/rest/clusters/bcs"] == 201
            assert ADMIN not in output
        finally:
            server.stop()


def _chunked_body_complete(body: bytes) -> bool:
    """Does ``body`` hold a whole chunked message, up to its last (empty) chunk?"""
    while True:
        size_line, found, rest = body.partition(b"\r\n")
        if not found:
            return False
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return rest.startswith(b"\r\n")
        if len(rest) < size + 2:
            return False
        body = rest[size + 2:]


class _SilentTLSServer(ConnectionServer):
    """An apiserver that completes the TLS handshake, reads the request and never answers."""

    def __init__(self) -> None:
        self.ca = trustme.CA()
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("127.0.0.1", "localhost").configure_cert(self.context)
        self.held: list[ssl.SSLSocket] = []
        super().__init__()

    def handle(self, conn: socket.socket) -> None:
        try:
            tls = self.context.wrap_socket(conn, server_side=True)
            tls.recv(65536)
            self.held.append(tls)  # held open, never answered
        except OSError:
            conn.close()

    def close(self) -> None:
        super().close()
        for tls in self.held:
            tls.close()


def test_a_gateway_whose_rbac_sync_waits_on_a_silent_cluster_stops_within_seconds(tmp_path: Path) -> None:
    """The RBAC reconciler is in the middle of a pass against an apiserver that never answers (its
    read timeout is 30 s): the stop does not wait for it; the lease is left to expire instead."""
    import json

    from tests.support.gateway import gateway_ini

    grants = tmp_path / "grants.json"
    grants.write_text(json.dumps({"version": 1, "grants": [
        {"user": "alice", "cluster": "rbac-silent", "namespace": "default", "role": "view"}]}))
    data = tmp_path / "data"
    ini = gateway_ini(tmp_path / "gateway.ini", data, rbac="true", rbac_source_file=str(grants),
                      rbac_interval="2s")
    silent = _SilentTLSServer()
    port = free_port()
    argv = [CLI, "serve", "--config", str(ini), "--data-dir", str(data), "--bind", f"127.0.0.1:{port}",
            "--workers", "2"]
    server = ServerProcess(argv, port=port, env={"BCS_ADMIN_TOKEN": ADMIN}, scheme="https", timeout=60)
    try:
        cafile = str(data / "tls" / "ca.crt")
        for method, path, body in [
            ("POST", "/rest/clusters/bcs", {"id": "rbac-silent", "project_id": "p", "cluster_type": "k8s"}),
            ("PUT", "/rest/clusters/rbac-silent/credentials",
             {"server_addresses": f"https://127.0.0.1:{silent.port}",
              "cacert_data": silent.ca.cert_pem.bytes().decode(), "user_token": "sa-silent"}),
        ]:
            req = urllib.request.Request(f"https://localhost:{port}{path}", data=json.dumps(body).encode(),
                                         method=method, headers={"Authorization": f"Bearer {ADMIN}"})
            urllib.request.urlopen(req, timeout=20, context=ssl.create_default_context(cafile=cafile)).close()
        # A pass is waiting for the silent apiserver's answer.
        assert wait_until(lambda: silent.held, 30)
        started = time.monotonic()
        server.signal(signal.SIGTERM)
        assert server.proc.wait(60) == 0
        took = time.monotonic() - started
        assert took < 5.0, f"the gateway took {took:.1f}s to stop"
        assert "Traceback" not in server.output()
    finally:
        server.stop()
        silent.close()
