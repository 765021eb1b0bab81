"""One gateway holds more concurrent watch streams than threads would allow and still answers requests.

``bcs-middleware serve`` with its defaults (the gevent worker: a stream is a greenlet, not a
thread): 600 streams, more than twice what serve's defaults give gthread (2 workers of 128
threads). The client is asyncio: every TLS connection in one thread. The scale run (thousands
to tens of thousands of watches, memory per watch) is ``bench/streams_bench.py``;
``BCS_TEST_STREAMS=2000`` runs this test at that size. ``BCS_TEST_WORKER_CLASS=gthread``
runs the same under gthread (with threads for every stream). The apiserver is the asyncio
one (:mod:`tests.support.watch_apiserver`): a thread per watch would cost more than the gateway.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import ssl
import time
from pathlib import Path

from tests.support.polling import wait_until
from tests.support.servers import BIN, ServerProcess, free_port, http_get, worker_class_under_test
from tests.support.watch_apiserver import WatchAPIServer

CLI = str(BIN / "bcs-middleware")
ADMIN = "capacity-admin-token-" + "c" * 22
STREAMS = int(os.environ.get("BCS_TEST_STREAMS", "600"))


def _enough_descriptors() -> None:
    # This process holds both ends that are not the gateway's: the clients and the apiserver.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * STREAMS + 512
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))


def test_many_watch_streams_and_ordinary_requests(tmp_path: Path) -> None:
    _enough_descriptors()
    with WatchAPIServer(token="sa-capacity") as api:
        port = free_port()
        argv = [CLI, "serve", "--data-dir", str(tmp_path), "--bind", f"127.0.0.1:{port}",
                "--graceful-timeout", "2", "--no-access-log"]
        worker_class = worker_class_under_test()
        argv += ["--worker-class", worker_class]
        if worker_class == "gthread":
            argv += ["--threads", str(STREAMS)]
        with ServerProcess(argv, port=port, env={"BCS_ADMIN_TOKEN": ADMIN}, scheme="https", timeout=60) as server:
            cafile = str(tmp_path / "tls" / "ca.crt")
            base = f"https://localhost:{port}"
            auth = {"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"}
            _post(base, "/rest/clusters/bcs", {"id": "cap", "project_id": "p", "cluster_type": "k8s"}, cafile)
            _put(base, "/rest/clusters/cap/credentials",
                 {"server_addresses": api.url, "cacert_data": api.ca_pem, "user_token": "sa-capacity"}, cafile)

            def meanwhile() -> None:
                assert wait_until(lambda: api.stats()["open"] >= STREAMS, 30, step=0.2), \
                    f"only {api.stats()['open']} watches reached the apiserver"
                # Ordinary requests are still answered while every stream is open.
                for _ in range(10):
                    status, _, body = http_get(f"{base}/tunnels/clusters/cap/version", headers=auth, cafile=cafile)
                    assert status == 200 and json.loads(body)["major"] == "1"
                    assert http_get(f"{base}/rest/clusters/cap", headers=auth, cafile=cafile)[0] == 200
                # And every stream delivers an event emitted now.
                assert api.broadcast() == STREAMS

            started = time.monotonic()
            delivered = asyncio.run(asyncio.wait_for(_watch_all(port, cafile, meanwhile), 90))
            assert delivered == STREAMS
            assert time.monotonic() - started < 60
            output = server.output()
    assert "Traceback" not in output


async def _watch_all(port: int, cafile: str, meanwhile) -> int:  # type: ignore[no-untyped-def]
    context = ssl.create_default_context(cafile=cafile)
    request = (f"GET /tunnels/clusters/cap/api/v1/namespaces/default/configmaps?watch=true "
               f"HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {ADMIN}\r\n\r\n").encode()
    opened = asyncio.Semaphore(200)  # handshakes in flight at once

    async def one() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        async with opened:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                           server_hostname="localhost")
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            return reader, writer

    streams = await asyncio.gather(*(one() for _ in range(STREAMS)))
    try:
        waiting = [asyncio.ensure_future(_until(reader, b"event-1")) for reader, _ in streams]
        await asyncio.get_running_loop().run_in_executor(None, meanwhile)
        return sum(await asyncio.gather(*waiting))
    finally:
        for _, writer in streams:
            writer.transport.abort()


async def _until(reader: asyncio.StreamReader, needle: bytes) -> int:
    seen = b""
    while needle not in seen:
        chunk = await reader.read(65536)
        if not chunk:
            return 0
        seen = (seen + chunk)[-4096:]
    return 1


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
