"""An asyncio TLS fake apiserver that holds any number of watches cheaply and broadcasts to them.

The threaded :class:`~tests.support.fake_apiserver.FakeAPIServer` spends a thread per
watch; thousands of watches need an event loop. This one runs in a subprocess and knows
just enough Kubernetes:

* ``GET ...?watch=true`` answers ``200`` chunked and holds the stream; ``watchid=ID`` in
  the query names it (the gateway forwards the query unchanged);
* any other request answers a small JSON object (``/version`` a version);
* ``POST /_broadcast`` (direct, not through the gateway) writes one event to every open
  watch, carrying ``time.monotonic()`` at sending (one clock for every process here);
* ``GET /_stats`` returns ``{"open": N, "opened": N, "closed": {ID: monotonic time}}``:
  when each named watch's connection was closed by its client (the gateway).

Requests need ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import trustme

from tests.support.servers import free_port


class _State:
    def __init__(self, token: str) -> None:
        self.token = token
        self.watches: set[asyncio.StreamWriter] = set()
        self.opened = 0
        self.closed: dict[str, float] = {}
        self.sequence = 0


def _answer(writer: asyncio.StreamWriter, status: str, body: bytes) -> None:
    writer.write(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)


async def _serve(state: _State, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
            length = int(headers.get("content-length") or 0)
            if length:
                await reader.readexactly(length)
            parts = urlsplit(target)
            query = parse_qs(parts.query)
            if parts.path == "/_broadcast" and method == "POST":
                state.sequence += 1
                event = json.dumps({"type": "ADDED", "object": {
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": f"event-{state.sequence}", "namespace": "default"},
                    "sent": time.monotonic()}}).encode() + b"\n"
                chunk = f"{len(event):x}\r\n".encode() + event + b"\r\n"
                for watch in list(state.watches):
                    watch.write(chunk)
                _answer(writer, "200 OK", json.dumps({"sent_to": len(state.watches)}).encode())
                continue
            if parts.path == "/_stats":
                body = json.dumps({"open": len(state.watches), "opened": state.opened, "closed": state.closed})
                _answer(writer, "200 OK", body.encode())
                continue
            if headers.get("authorization") != f"Bearer {state.token}":
                _answer(writer, "401 Unauthorized", b'{"kind":"Status","code":401}')
                continue
            if query.get("watch") == ["true"]:
                await _hold_watch(state, reader, writer, (query.get("watchid") or [""])[0])
                return
            if parts.path == "/version":
                _answer(writer, "200 OK", b'{"major":"1","minor":"30","gitVersion":"v1.30.0"}')
            else:
                _answer(writer, "200 OK", json.dumps({"kind": "ConfigMap", "metadata": {"name": "x"},
                                                      "data": {"path": parts.path}}).encode())
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, ValueError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.transport.abort()


async def _hold_watch(state: _State, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      watch_id: str) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    state.watches.add(writer)
    state.opened += 1
    try:
        # A watch's client sends nothing more: the read ends when it closes the connection.
        while await reader.read(65536):
            pass
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        state.watches.discard(writer)
        if watch_id:
            state.closed[watch_id] = time.monotonic()


async def _main(port: int, cert: str, key: str, token: str, hosts: list[str]) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    state = _State(token)
    server = await asyncio.start_server(lambda r, w: _serve(state, r, w), hosts, port,
                                        ssl=context, backlog=4096, limit=1 << 20)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


class WatchAPIServer:
    """The fake in a subprocess: ``url``, ``ca_pem``, ``broadcast()``, ``stats()``.

    :param hosts: the loopback addresses it listens on (one port), ``url`` names the first;
        ``url_for(host)`` another (a benchmark reaches one address directly and another only
        through an agent).
    """

    def __init__(self, token: str, hosts: tuple[str, ...] = ("127.0.0.1",)) -> None:
        self.token = token
        self.hosts = hosts
        self.port = free_port()
        self.url = self.url_for(hosts[0])
        ca = trustme.CA()
        self.ca_pem = ca.cert_pem.bytes().decode()
        self._dir = tempfile.TemporaryDirectory(prefix="watch-apiserver-")
        cert = ca.issue_cert("127.0.0.1", "localhost", *(h for h in hosts if h != "127.0.0.1"))
        self._cert = Path(self._dir.name) / "cert.pem"
        self._key = Path(self._dir.name) / "key.pem"
        cert.cert_chain_pems[0].write_to_path(str(self._cert))
        for pem in cert.cert_chain_pems[1:]:
            with self._cert.open("ab") as fh:
                fh.write(pem.bytes())
        cert.private_key_pem.write_to_path(str(self._key))
        self._control = ssl.create_default_context(cadata=self.ca_pem)
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> WatchAPIServer:
        root = Path(__file__).resolve().parents[2]
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.watch_apiserver", str(self.port), str(self._cert),
             str(self._key), self.token, ",".join(self.hosts)],
            cwd=root, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(root)})
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        assert line.strip() == "ready", line
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
            if self._proc.stdout is not None:
                self._proc.stdout.close()
        self._dir.cleanup()

    def url_for(self, host: str) -> str:
        return f"https://[{host}]:{self.port}" if ":" in host else f"https://{host}:{self.port}"

    def _call(self, method: str, path: str) -> Any:
        req = urllib.request.Request(self.url + path, method=method, data=b"" if method == "POST" else None)
        with urllib.request.urlopen(req, timeout=30, context=self._control) as resp:
            return json.loads(resp.read())

    @property
    def pid(self) -> int | None:
        """The fake's process id (benchmarks read its CPU time)."""
        return self._proc.pid if self._proc is not None else None

    def broadcast(self) -> int:
        """Send one event to every open watch; returns how many."""
        return int(self._call("POST", "/_broadcast")["sent_to"])

    def stats(self) -> dict[str, Any]:
        return dict(self._call("GET", "/_stats"))


async def open_watch(port: int, context: ssl.SSLContext, prefix: str, token: str, wid: str,
                     gate: asyncio.Semaphore) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """A client's TLS watch named ``wid`` on ``127.0.0.1:port`` (``prefix``: the path before
    ``/api``, e.g. the gateway's tunnel path), once its ``200`` head arrived; ``None`` when
    it could not be opened. ``gate`` bounds the TLS handshakes in flight."""
    request = (f"GET {prefix}/api/v1/namespaces/default/configmaps?watch=true&watchid={wid} HTTP/1.1\r\n"
               f"Host: localhost\r\nAuthorization: Bearer {token}\r\n\r\n").encode()
    async with gate:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost"), 30)
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ssl.SSLError):
            return None
    if not head.startswith(b"HTTP/1.1 200"):
        writer.transport.abort()
        return None
    return reader, writer


UVLOOP_ENV = "WATCH_APISERVER_UVLOOP"


def use_uvloop() -> bool:
    """Run asyncio on uvloop when ``WATCH_APISERVER_UVLOOP=1`` and it is installed (benchmarks only).

    At 10,000 connections the harness's own event loop is a large share of two cores
    (``bench/streams_bench.py --direct`` measures the harness alone); the benchmark turns
    this on for its client and this fake apiserver. Tests keep the standard loop.
    """
    if os.environ.get(UVLOOP_ENV) != "1":
        return False
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


if __name__ == "__main__":
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    use_uvloop()
    asyncio.run(_main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5].split(",")))
