"""One gateway on this machine holds 500 concurrent watch streams and still answers requests.

The documented deployment (README, examples/gunicorn.conf.py) runs gunicorn's gthread worker:
each open stream holds one worker thread, so capacity = workers x threads.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import ssl
import time
from pathlib import Path

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.servers import BIN, ServerProcess, free_port, http_get

CLI = str(BIN / "bcs-middleware")
ADMIN = "capacity-admin-token-" + "c" * 22
STREAMS = int(os.environ.get("BCS_TEST_STREAMS", "500"))


def test_500_watch_streams_and_ordinary_requests(tmp_path: Path) -> None:
    with FakeAPIServer(token="sa-capacity") as api:
        port = free_port()
        argv = [CLI, "serve", "--data-dir", str(tmp_path), "--bind", f"127.0.0.1:{port}",
                "--workers", "2", "--threads", "512", "--graceful-timeout", "2", "--no-access-log"]
        with ServerProcess(argv, port=port, env={"BCS_ADMIN_TOKEN": ADMIN}, scheme="https", timeout=60) as server:
            cafile = str(tmp_path / "tls" / "ca.crt")
            base = f"https://localhost:{port}"
            auth = {"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"}
            _post(base, "/rest/clusters/bcs", {"id": "cap", "project_id": "p", "cluster_type": "k8s"}, cafile)
            _put(base, "/rest/clusters/cap/credentials",
                 {"server_addresses": api.url, "cacert_data": api.ca_pem, "user_token": "sa-capacity"}, cafile)

            context = ssl.create_default_context(cafile=cafile)
            sockets: list[ssl.SSLSocket] = []
            try:
                request = (f"GET /tunnels/clusters/cap/api/v1/namespaces/default/configmaps?watch=true "
                           f"HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {ADMIN}\r\n\r\n").encode()
                for _ in range(STREAMS):
                    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
                    sock = context.wrap_socket(raw, server_hostname="localhost")
                    sock.sendall(request)
                    sockets.append(sock)
                _wait_all(sockets, b"HTTP/1.1 200", deadline_s=90)
                deadline = time.monotonic() + 30
                while api.open_watches < STREAMS:
                    assert time.monotonic() < deadline, f"only {api.open_watches} watches reached the apiserver"
                    time.sleep(0.1)

                # Ordinary requests are still answered while every stream is open.
                for _ in range(20):
                    status, _, body = http_get(f"{base}/tunnels/clusters/cap/version", headers=auth, cafile=cafile)
                    assert status == 200 and json.loads(body)["major"] == "1"
                    assert http_get(f"{base}/rest/clusters/cap", headers=auth, cafile=cafile)[0] == 200

                # And every stream delivers an event emitted now.
                api.store.create("configmaps", {"metadata": {"name": "hello-500", "namespace": "default"}})
                _wait_all(sockets, b"hello-500", deadline_s=60)
            finally:
                for sock in sockets:
                    sock.close()
            output = server.output()
    assert "Traceback" not in output


def _wait_all(sockets: list[ssl.SSLSocket], needle: bytes, deadline_s: float) -> None:
    selector = selectors.DefaultSelector()
    seen: dict[int, bytes] = {}
    for index, sock in enumerate(sockets):
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, index)
        seen[index] = b""
    waiting = set(seen)
    deadline = time.monotonic() + deadline_s
    try:
        while waiting:
            assert time.monotonic() < deadline, f"{len(waiting)} of {len(sockets)} streams never saw {needle!r}"
            for key, _ in selector.select(timeout=1.0):
                index = key.data
                sock = sockets[index]
                while True:
                    try:
                        chunk = sock.recv(65536)
                    except (ssl.SSLWantReadError, BlockingIOError):
                        break
                    if not chunk:
                        raise AssertionError(f"stream {index} closed before {needle!r}")
                    seen[index] = (seen[index] + chunk)[-4096:]
                if index in waiting and needle in seen[index]:
                    waiting.discard(index)
    finally:
        selector.close()
        for sock in sockets:
            sock.setblocking(True)


def _post(base: str, path: str, body: dict, cafile: str) -> None:
    _send("POST", base, path, body, cafile)


def _put(base: str, path: str, body: dict, cafile: str) -> None:
    _send("PUT", base, path, body, cafile)


def _send(method: str, base: str, path: str, body: dict, cafile: str) -> None:
    import urllib.request

    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method=method,
                                 headers={"Authorization": f"Bearer {ADMIN}"})
    with urllib.request.urlopen(req, timeout=30, context=ssl.create_default_context(cafile=cafile)) as resp:
        assert resp.status in (200, 201)
