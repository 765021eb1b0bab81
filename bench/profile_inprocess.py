#!/usr/bin/env python
"""Per-request cost of the proxy paths in one process, without a server: where the time goes.

Calls the WSGI apps directly with a gunicorn-like environ against a real nginx
upstream on loopback, one thread, N requests each; prints µs per request and,
with ``--profile``, the top of a cProfile of the tunnel path.

Usage: ``python bench/profile_inprocess.py [-n 5000] [--canned] [--layers]
[--profile tunnel|tunnel_imp|upstream_proxy]``

``--layers`` adds the gateway's stack entered at each layer in turn (that layer
and everything inside it, given what the outer layers would have set), and the
tunnel with the access log off: the difference between neighbours is what one
layer costs.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))


def _environ(path: str, headers: dict[str, str]) -> dict[str, Any]:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "GET",
        "SCRIPT_NAME": "",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "RAW_URI": path,
        "SERVER_PROTOCOL": "HTTP/1.1",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "REMOTE_ADDR": "127.0.0.1",
        "REMOTE_PORT": "40000",
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(b""),
        "HTTP_HOST": "127.0.0.1:8000",
        # The rest of what gunicorn 27 puts in every environ.
        "SERVER_SOFTWARE": "gunicorn/27.0.1",
        "wsgi.version": (1, 0),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
        "wsgi.file_wrapper": object,
        "wsgi.input_terminated": True,
        "wsgi.early_hints": None,
        "gunicorn.socket": None,
    }
    for name, value in headers.items():
        environ["HTTP_" + name.upper().replace("-", "_")] = value
    return environ


def _one(app: Any, path: str, headers: dict[str, str]) -> int:
    status = []

    def start_response(s: str, h: list[tuple[str, str]], exc_info: Any = None) -> Any:
        status.append(s)
        return lambda data: None

    body = app(_environ(path, headers), start_response)
    size = sum(len(piece) for piece in body)
    close = getattr(body, "close", None)
    if close is not None:
        close()
    assert status and status[0].startswith("200"), status
    return size


class _CannedSocket:
    """A connected socket whose peer answers every request at once, with the same bytes."""

    def __init__(self, answer: bytes) -> None:
        self._answer = answer

    def gettimeout(self) -> float | None:
        return None

    def settimeout(self, value: float | None) -> None:
        pass

    def setsockopt(self, *args: Any) -> None:
        pass

    def sendall(self, data: bytes) -> None:
        pass

    def send(self, data: bytes) -> int:
        return len(data)

    def recv(self, size: int) -> bytes:
        return self._answer  # smaller than any receive the transport makes

    def close(self) -> None:
        pass


def canned_transport(answer: bytes) -> Any:
    """The real transport over a socket that answers at once: the Python cost without the network's."""
    # Imported here: the metrics directory must be set before bcs_middleware loads.
    from bcs_middleware.outbound.streams import SocketConnection
    from bcs_middleware.outbound.transport import PooledTransport

    class CannedBackend:
        def connect(self, key: Any, label: str, timeout: float, **_kwargs: Any) -> SocketConnection:
            return SocketConnection(_CannedSocket(answer), key)  # type: ignore[arg-type]

        def prune(self) -> None:
            pass

    return PooledTransport(backend=CannedBackend())


def _nginx_answer(url: str, path: str, body_size: int) -> bytes:
    """nginx's exact answer to the benchmark request, head and body, as bytes."""
    host, port = url.rsplit("/", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + body_size:
            data += sock.recv(65536)
    return data


def _layer_cases(gateway: Any, path: str, headers: dict[str, str], store: Any, transport: Any,
                 config: Any) -> dict[str, tuple[Any, str, dict[str, str]]]:
    """The superuser tunnel entered at each layer, and with the access log off.

    A layer inside token auth gets the user auth would have set; one inside
    routing also gets the cluster and upstream routing would have set.
    """
    import dataclasses

    from bcs_middleware.compose.gateway import build_gateway
    from bcs_middleware.core import environ as env

    chain = [gateway]
    while True:
        inner = getattr(chain[-1], "app", None) or getattr(chain[-1], "tunnel", None)
        if inner is None or inner is chain[-1]:
            break
        chain.append(inner)
    auth = next(layer for layer in chain if hasattr(layer, "authenticator"))
    routing = next(layer for layer in chain if hasattr(layer, "route"))
    user = auth.authenticator.authenticate(headers["Authorization"].split()[1])
    routed = _environ(path, headers)
    routed[env.USER] = user
    routing.route(routed)
    set_by_routing = {env.CLUSTER: routed[env.CLUSTER], env.UPSTREAM: routed[env.UPSTREAM],
                      env.ERROR_STYLE: "kubernetes"}

    def entered(layer: Any, given: dict[str, Any]) -> Any:
        def app(environ: dict[str, Any], start_response: Any) -> Any:
            environ.update(given)
            return layer(environ, start_response)
        return app

    cases: dict[str, tuple[Any, str, dict[str, str]]] = {}
    below_routing = False
    for layer in chain[1:]:
        given: dict[str, Any] = {env.USER: user} if layer is not auth else {}
        if below_routing:
            given.update(set_by_routing)
        below_routing = below_routing or layer is routing
        cases[f"from {type(layer).__name__}"] = (entered(layer, given), path, headers)
    quiet = build_gateway(dataclasses.replace(config, server=dataclasses.replace(config.server, access_log=False)),
                          store=store, transport=transport, background=False)
    cases["tunnel, no access log"] = (quiet, path, headers)
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--canned", action="store_true",
                        help="the real transport over a socket answering nginx's bytes at once: "
                             "the Python cost only, without the network's")
    parser.add_argument("--profile", choices=["tunnel", "tunnel_imp", "upstream_proxy"])
    parser.add_argument("--only", help="comma-separated cases to time (default: all); e.g. to "
                                       "attach a sampling profiler (py-spy) to one of them")
    parser.add_argument("--layers", action="store_true",
                        help="also time the gateway entered at each layer, and without the access log")
    parser.add_argument("--access-log", default="/dev/null",
                        help="where the gateway's JSON access log goes (default /dev/null)")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="proxy-profile-"))
    tmp.chmod(0o755)
    (tmp / "metrics").mkdir()
    # Must precede the first import of bcs_middleware.telemetry.metrics, as under ``serve``.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(tmp / "metrics")
    import logging

    import proxy_bench as pb

    from bcs_middleware.apps.proxy import UpstreamProxy
    from bcs_middleware.compose.config import AuthSettings, ClusterSettings, GatewayConfig, StoreSettings
    from bcs_middleware.compose.gateway import build_gateway
    from bcs_middleware.store.sql import open_store
    from bcs_middleware.telemetry.logsetup import LineWriterHandler

    # As ``serve`` sets it up (configure_logging), to --access-log instead of stdout.
    access = logging.getLogger("bcs_middleware.access")
    access.addHandler(LineWriterHandler(open(args.access_log, "w")))  # noqa: SIM115 - lives as long as the run
    access.propagate = False
    access.setLevel(logging.INFO)

    nginx = pb._start_nginx(tmp, pb.Pki.create(tmp), pb.free_port())  # its plain-HTTP listener is used
    try:
        data_dir = tmp / "gateway"
        store = open_store(data_dir=data_dir)
        store.create_cluster(pb.CLUSTER_ID, project_id="bench", cluster_type="k8s")
        store.put_credentials(pb.CLUSTER_ID, server_addresses=[nginx.url], cacert_pem="",
                              user_token="cluster-sa-token")
        tokens = {}
        for name, superuser in (("tunnel", True), ("tunnel_imp", False)):
            user = store.create_user(name, is_superuser=superuser)
            if not superuser:
                store.set_cluster_permission(pb.CLUSTER_ID, user.id, "view")  # a user of the cluster, not its manager
            tokens[name] = store.create_token(user.id)[1]
        transport = (canned_transport(_nginx_answer(nginx.url, "/payload.bin", pb.BODY_SIZE))
                     if args.canned else None)
        # Caches that outlive the run: a refill (a store query) every few seconds would
        # land in some rounds and not others.
        config = GatewayConfig(store=StoreSettings(data_dir=data_dir), auth=AuthSettings(token_cache_ttl=3600),
                               clusters=ClusterSettings(cache_ttl=3600))
        gateway = build_gateway(config, store=store, transport=transport, background=False)
        proxy = UpstreamProxy(upstream=nginx.url, transport=transport)
        tunnel_path = f"/tunnels/clusters/{pb.CLUSTER_ID}/payload.bin"
        cases = {
            "upstream_proxy": (proxy, "/payload.bin", {}),
            "tunnel": (gateway, tunnel_path, {"Authorization": f"Bearer {tokens['tunnel']}"}),
            "tunnel_imp": (gateway, tunnel_path, {"Authorization": f"Bearer {tokens['tunnel_imp']}"}),
        }
        if args.layers:
            cases.update(_layer_cases(gateway, tunnel_path, cases["tunnel"][2], store, transport,
                                      config))
        if args.only:
            cases = {name: case for name, case in cases.items() if name in args.only.split(",")}
        for app, path, headers in cases.values():
            for _ in range(200):
                _one(app, path, headers)
        # The machine is shared and drifts: alternate short rounds, keep each case's best.
        best: dict[str, tuple[float, float]] = {}
        for _round in range(args.rounds):
            for name, (app, path, headers) in cases.items():
                started = time.perf_counter()
                cpu = time.process_time()
                for _ in range(args.n // args.rounds):
                    _one(app, path, headers)
                wall = (time.perf_counter() - started) / (args.n // args.rounds) * 1e6
                cpu_us = (time.process_time() - cpu) / (args.n // args.rounds) * 1e6
                prev = best.get(name, (wall, cpu_us))
                best[name] = (min(prev[0], wall), min(prev[1], cpu_us))
        for name, (wall, cpu_us) in best.items():
            print(f"{name:32} {wall:7.1f} us/req wall {cpu_us:7.1f} us/req CPU (best of {args.rounds})",
                  flush=True)
        if args.profile:
            app, path, headers = cases[args.profile]
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.n):
                _one(app, path, headers)
            prof.disable()
            stats = pstats.Stats(prof)
            stats.sort_stats("tottime").print_stats(30)
            stats.sort_stats("cumulative").print_stats(40)
    finally:
        nginx.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
