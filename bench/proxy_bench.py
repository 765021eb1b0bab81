#!/usr/bin/env python
"""Loopback benchmark of the upstream proxy against its alternatives — ratios, not absolutes.

Contenders, all serving the same static bytes:

1. ``nginx``         — nginx itself (the upstream of the proxies), the floor of any cost;
2. ``upstream_proxy`` — ``bcs_middleware.apps.proxy`` under gunicorn, in front of nginx;
3. ``werkzeug``      — werkzeug's ``ProxyMiddleware`` under the same gunicorn settings;
4. ``ceiling``       — a gunicorn app answering the same bytes without proxying: the most any
   Python WSGI proxy under these gunicorn settings could reach.

The machine's speed drifts, so contenders alternate (A B C D, A B C D, …) and the report gives
medians and the median of per-round ratios, at each concurrency level of ``--connections`` and
for each contender's best level per round (its capacity, which the targets use). Load comes
from ``wrk`` (Debian package) in its own process, or a threaded ``http.client`` loader
(``--loader python``) when wrk is missing.
CPU per request is the servers' CPU time (``/proc/<pid>/stat``, every process of the contender,
nginx included behind a proxy) over the requests served; upstream connections per request come
from nginx's ``stub_status`` accepts counter.

Then 1 GiB is uploaded (chunked) and downloaded through ``upstream_proxy``, reporting the
gunicorn workers' peak RSS growth (``VmHWM`` after ``clear_refs``).

Contenders are pluggable: append a :class:`Contender` whose ``start(ctx)`` returns a
:class:`Running` (base URL, headers, process ids) — the gateway tunnel will be one.

Usage: ``python bench/proxy_bench.py [--rounds 5] [--duration 5] [--connections 16,64]``
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from tests.support.fake_upstream import FakeUpstream  # noqa: E402
from tests.support.servers import BIN, ServerProcess, free_port, gunicorn, http_get  # noqa: E402

# `bcs-middleware serve`'s defaults (2 workers, gevent; --threads 128 under gthread), for every contender.
GUNICORN = {"workers": 2, "worker_class": "gevent", "threads": 128}
# Extra gunicorn arguments, the same for every contender (--switch-interval adds a config file).
# --reuse-port: every worker listens on its own SO_REUSEPORT socket and the kernel spreads
# connections over them. With the one shared socket, the worker that happens to be awake
# accepts wrk's whole burst of connections: in about a third of the rounds one worker served
# all 16 and the other idled, halving that round's figure (--shared-socket shows it).
GUNICORN_EXTRA: list[str] = ["--reuse-port"]
BODY_SIZE = 2048
GiB = 1024**3
MiB = 1024**2
TICK = os.sysconf("SC_CLK_TCK")


# -- WSGI apps gunicorn imports from this module ("--chdir bench proxy_bench:...()") ------------


def ceiling_app():  # type: ignore[no-untyped-def]
    body = Path(os.environ["BENCH_FILE"]).read_bytes()
    headers = [("Content-Type", "application/octet-stream"), ("Content-Length", str(len(body)))]

    def app(environ, start_response):  # type: ignore[no-untyped-def]
        start_response("200 OK", headers)
        return [body]

    return app


def gateway_app():  # type: ignore[no-untyped-def]
    """The real gateway, built per worker as ``bcs-middleware serve`` builds it.

    Logging is configured by the same function ``serve`` uses, so the JSON access
    line goes to stdout (the server's log file here) exactly as in production.
    """
    from bcs_middleware.compose.gateway import build_gateway, config_from_options
    from bcs_middleware.telemetry.logsetup import configure_logging

    configure_logging("info")
    # Through the ini keys, which every tree compared with --tree understands.
    return build_gateway(config_from_options("bench", {
        "data_dir": os.environ["BENCH_DATA_DIR"],
        "access_log": "false" if os.environ.get("BENCH_ACCESS_LOG") == "0" else "true"}))


def werkzeug_app():  # type: ignore[no-untyped-def]
    from werkzeug.exceptions import NotFound
    from werkzeug.middleware.http_proxy import ProxyMiddleware

    # werkzeug turns a "/" prefix into "//", so the proxied tree lives under /p/.
    return ProxyMiddleware(
        NotFound(), {"/p/": {"target": os.environ["BENCH_UPSTREAM"] + "/", "remove_prefix": True}}
    )


# -- processes ---------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _tree(pid: int) -> list[int]:
    return [pid, *_children(pid)]


def _cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def _vm_kib(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return 0


@dataclass
class Context:
    tmp: Path
    file_url_path: str
    nginx: ServerProcess
    status_url: str
    pki: Pki
    # nginx's TLS listener: the upstream of the production-path contenders.
    nginx_tls_url: str
    gateway: tuple[ServerProcess, dict[str, str]] | None = None
    served: tuple[ServerProcess, dict[str, str]] | None = None

    def nginx_accepts(self) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.nginx.port, timeout=5)
        try:
            conn.request("GET", "/nginx_status")
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
        # "server accepts handled requests\n N N N"
        return int(text.splitlines()[2].split()[0])


@dataclass
class Running:
    url: str
    pids: Callable[[], list[int]]
    headers: dict[str, str] = field(default_factory=dict)
    # The CA of an https:// url (wrk does not verify; the readiness check does).
    cafile: str | None = None
    # True when requests reach nginx through a proxy: count its accepted connections.
    proxied: bool = True
    stop: Callable[[], object] = lambda: None
    # The gunicorn worker processes (for the balance figure); none for nginx.
    workers: Callable[[], list[int]] = lambda: []


@dataclass
class Contender:
    name: str
    start: Callable[[Context], Running]


@dataclass
class Pki:
    """A CA and one server certificate (localhost and ``hosts``) for nginx and the bench's gunicorns."""

    ca_file: Path
    cert_file: Path
    key_file: Path

    @classmethod
    def create(cls, tmp: Path, hosts: tuple[str, ...] = ("127.0.0.1",)) -> Pki:
        import trustme

        ca = trustme.CA()
        cert = ca.issue_cert("localhost", *hosts)
        tls = tmp / "tls"
        tls.mkdir()
        pki = cls(tls / "ca.pem", tls / "server.pem", tls / "server.key")
        ca.cert_pem.write_to_path(str(pki.ca_file))
        cert.private_key_pem.write_to_path(str(pki.key_file))
        with pki.cert_file.open("wb") as out:
            for blob in cert.cert_chain_pems:
                out.write(blob.bytes())
        return pki

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(self.cert_file), str(self.key_file))
        return context


def _start_nginx(tmp: Path, pki: Pki, tls_port: int) -> ServerProcess:
    """nginx serving the payload over plain HTTP (and ``stub_status``) and over TLS on ``tls_port``."""
    port = free_port()
    www = tmp / "www"
    www.mkdir()
    (www / "payload.bin").write_bytes(hashlib.sha256(b"bench").digest() * (BODY_SIZE // 32))
    for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp / name).mkdir()
    conf = tmp / "nginx.conf"
    conf.write_text(f"""
daemon off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port};
        root {www};
        location = /nginx_status {{ stub_status; }}
    }}
    server {{
        listen 127.0.0.1:{tls_port} ssl;
        ssl_certificate {pki.cert_file};
        ssl_certificate_key {pki.key_file};
        root {www};
    }}
}}
""")
    return ServerProcess([*PEER_PREFIX, "nginx", "-p", str(tmp), "-e", f"{tmp}/error.log", "-c", str(conf)],
                         port=port)


def _start_nginx_proxy(tmp: Path, pki: Pki, upstream_tls_port: int, workers: int) -> ServerProcess:
    """nginx as a TLS-to-TLS reverse proxy in front of the nginx upstream: the C reference.

    As the gateway does: keep-alive upstream connections, upstream TLS verified against the CA,
    TLS sessions reused.
    """
    port = free_port()
    home = tmp / "nginx-proxy"
    home.mkdir()
    for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (home / name).mkdir()
    conf = home / "nginx.conf"
    conf.write_text(f"""
daemon off;
worker_processes {workers};
pid {home}/nginx.pid;
error_log {home}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {home}/body;
    proxy_temp_path {home}/proxy;
    fastcgi_temp_path {home}/fastcgi;
    uwsgi_temp_path {home}/uwsgi;
    scgi_temp_path {home}/scgi;
    upstream apiserver {{
        server 127.0.0.1:{upstream_tls_port};
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {pki.cert_file};
        ssl_certificate_key {pki.key_file};
        location / {{
            proxy_pass https://apiserver;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate {pki.ca_file};
            proxy_ssl_name localhost;
            proxy_ssl_session_reuse on;
        }}
    }}
}}
""")
    return ServerProcess([*PEER_PREFIX, "nginx", "-p", str(home), "-e", f"{home}/error.log", "-c", str(conf)],
                         port=port, scheme="https")


def _gunicorn_tree(server: ServerProcess, ctx: Context, with_nginx: bool) -> Callable[[], list[int]]:
    def pids() -> list[int]:
        out = _tree(server.proc.pid)
        if with_nginx:
            out += _tree(ctx.nginx.proc.pid)
        return out

    return pids


def _workers(server: ServerProcess) -> Callable[[], list[int]]:
    return lambda: _children(server.proc.pid)


def _serve(app: str, env: dict[str, str] | None = None) -> ServerProcess:
    """gunicorn with the settings every contender shares."""
    extra = [*GUNICORN_EXTRA] if app.endswith(".ini") else ["--chdir", str(BENCH), *GUNICORN_EXTRA]
    return gunicorn(app, extra=extra, env=env, **GUNICORN)  # type: ignore[arg-type]


def _switch_interval_config(tmp: Path, seconds: float) -> Path:
    conf = tmp / "gunicorn_switch.py"
    conf.write_text("import sys\n\n\ndef post_fork(server, worker):\n"
                    f"    sys.setswitchinterval({seconds!r})\n")
    return conf


def start_nginx_direct(ctx: Context) -> Running:
    return Running(ctx.nginx.url, lambda: _tree(ctx.nginx.proc.pid), proxied=False)


def start_upstream_proxy(ctx: Context) -> Running:
    ini = ctx.tmp / "upstream_proxy.ini"
    ini.write_text("[app:main]\nuse = egg:bcs-middleware#upstream_proxy\n"
                   f"upstream = {ctx.nginx.url}\n")
    # As under ``bcs-middleware serve --config``: metrics in multiprocess mode.
    metrics_dir = ctx.tmp / "upstream-proxy-metrics"
    metrics_dir.mkdir()
    server = _serve(str(ini), env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})
    return Running(server.url, _gunicorn_tree(server, ctx, True), stop=server.stop,
                   workers=_workers(server))


def start_werkzeug(ctx: Context) -> Running:
    server = _serve("proxy_bench:werkzeug_app()", env={"BENCH_UPSTREAM": ctx.nginx.url})
    return Running(server.url + "/p", _gunicorn_tree(server, ctx, True), stop=server.stop,
                   workers=_workers(server))


def start_ceiling(ctx: Context) -> Running:
    server = _serve("proxy_bench:ceiling_app()",
                    env={"BENCH_FILE": str(ctx.tmp / "www" / "payload.bin")})
    return Running(server.url, _gunicorn_tree(server, ctx, False), proxied=False,
                   stop=server.stop, workers=_workers(server))


CLUSTER_ID = "BCS-K8S-BENCH"


def _start_gateway(tmp: Path, name: str, upstream_url: str,
                   access_log: bool = True) -> tuple[ServerProcess, dict[str, str]]:
    """A gateway whose one k8s cluster's apiserver is ``upstream_url``; a token per kind of user.

    The cluster's credentials are written straight into the store with an
    ``http://`` address: the management API's schema would demand ``https://``,
    but the routing layer proxies to whatever the store holds, and TLS stays off
    for every contender so the comparison is about the WSGI path, not about who
    encrypts (serving nginx over TLS for the tunnel alone would tilt it).
    """
    from bcs_middleware.store.sql import open_store

    data_dir = tmp / name
    store = open_store(data_dir=data_dir)
    try:
        store.create_cluster(CLUSTER_ID, project_id="bench", cluster_type="k8s")
        store.put_credentials(CLUSTER_ID, server_addresses=[upstream_url], cacert_pem="",
                              user_token="cluster-sa-token")
        tokens = {}
        for user_name, superuser in (("bench-admin", True), ("bench-user", False)):
            user = store.create_user(user_name, is_superuser=superuser)
            if not superuser:
                store.set_cluster_permission(CLUSTER_ID, user.id, "view")  # a user of the cluster, not its manager
            tokens[user_name] = store.create_token(user.id)[1]
    finally:
        store.db.dispose()
    metrics_dir = tmp / f"{name}-metrics"
    metrics_dir.mkdir()
    server = _serve("proxy_bench:gateway_app()",
                    env={"BENCH_DATA_DIR": str(data_dir), "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
                         "BENCH_ACCESS_LOG": "1" if access_log else "0"})
    return server, tokens


def _gateway(ctx: Context) -> tuple[ServerProcess, dict[str, str]]:
    """One gateway for both tunnel contenders, in front of the nginx upstream."""
    if ctx.gateway is None:
        ctx.gateway = _start_gateway(ctx.tmp, "gateway", ctx.nginx.url)
    return ctx.gateway


def _tunnel(ctx: Context, gateway: tuple[ServerProcess, dict[str, str]], user: str) -> Running:
    server, tokens = gateway
    return Running(server.url + f"/tunnels/clusters/{CLUSTER_ID}",
                   _gunicorn_tree(server, ctx, True),
                   headers={"Authorization": f"Bearer {tokens[user]}"},
                   stop=server.stop, workers=_workers(server))


def start_tunnel(ctx: Context) -> Running:
    """Superuser token: auth, routing, admission pass-through, proxy; no impersonation."""
    return _tunnel(ctx, _gateway(ctx), "bench-admin")


def start_tunnel_impersonate(ctx: Context) -> Running:
    """A plain user: the same, plus ``Impersonate-User``/``-Group`` headers upstream."""
    return _tunnel(ctx, _gateway(ctx), "bench-user")


def start_tunnel_no_access_log(ctx: Context) -> Running:
    """The superuser tunnel with the access log off: what the log line costs (--only)."""
    gateway = _start_gateway(ctx.tmp, "gateway-nolog", ctx.nginx.url, access_log=False)
    return _tunnel(ctx, gateway, "bench-admin")


# -- the production path: HTTPS from the client, HTTPS to the upstream --------------------------


def _production_config(tmp: Path) -> Path:
    """The gunicorn settings ``bcs-middleware serve`` adds, for the other HTTPS gunicorns.

    The same connection slots and the same reused server SSL context, so the ceiling and
    ``upstream_proxy`` differ from ``serve`` only by the application.
    """
    conf = tmp / "gunicorn_production.py"
    if not conf.exists():
        conf.write_text(
            "from bcs_middleware.cli.serve_options import connection_slots\n"
            "from bcs_middleware.pki.reload import gunicorn_ssl_context as ssl_context  # noqa: F401\n\n"
            f"globals().update(connection_slots({GUNICORN['worker_class']!r}, {GUNICORN['threads']!r}))\n"
        )
    return conf


def _serve_tls(ctx: Context, app: str, env: dict[str, str] | None = None) -> ServerProcess:
    """gunicorn over HTTPS with the settings ``serve`` uses (``--reuse-port`` unless --shared-socket)."""
    extra = ["-c", str(_production_config(ctx.tmp)), *GUNICORN_EXTRA]
    if not app.endswith(".ini"):
        extra += ["--chdir", str(BENCH)]
    tls = {"certfile": str(ctx.pki.cert_file), "keyfile": str(ctx.pki.key_file)}
    settings = dict(GUNICORN)
    if settings["worker_class"] == "gevent" and SERVE_WORKER:
        # serve's own gevent worker (its head/idle timeouts, its writes and Date header), so
        # that the ceiling and upstream_proxy differ from serve only by the application.
        settings["worker_class"] = "bcs_middleware.serving.gevent_worker.GatewayGeventWorker"
    return gunicorn(app, extra=extra, env=env, **tls, **settings)  # type: ignore[arg-type]


def start_tls_ceiling(ctx: Context) -> Running:
    server = _serve_tls(ctx, "proxy_bench:ceiling_app()",
                        env={"BENCH_FILE": str(ctx.tmp / "www" / "payload.bin")})
    return Running(server.url, _gunicorn_tree(server, ctx, False), proxied=False, stop=server.stop,
                   workers=_workers(server), cafile=str(ctx.pki.ca_file))


def start_tls_upstream_proxy(ctx: Context) -> Running:
    ini = ctx.tmp / "upstream_proxy_tls.ini"
    ini.write_text("[app:main]\nuse = egg:bcs-middleware#upstream_proxy\n"
                   f"upstream = {ctx.nginx_tls_url}\nca_file = {ctx.pki.ca_file}\n")
    metrics_dir = ctx.tmp / "upstream-proxy-tls-metrics"
    metrics_dir.mkdir()
    server = _serve_tls(ctx, str(ini), env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})
    return Running(server.url, _gunicorn_tree(server, ctx, True), stop=server.stop,
                   workers=_workers(server), cafile=str(ctx.pki.ca_file))


def start_nginx_proxy(ctx: Context) -> Running:
    upstream_tls_port = int(ctx.nginx_tls_url.rsplit(":", 1)[1])
    proxy = _start_nginx_proxy(ctx.tmp, ctx.pki, upstream_tls_port, int(str(GUNICORN["workers"])))

    def pids() -> list[int]:
        return _tree(proxy.proc.pid) + _tree(ctx.nginx.proc.pid)

    return Running(proxy.url, pids, stop=proxy.stop, cafile=str(ctx.pki.ca_file))


SERVE_ADMIN = "bench-admin-token-" + "b" * 32


def _rest(base: str, cafile: str, method: str, path: str, body: dict[str, object] | None = None,
          token: str = SERVE_ADMIN) -> dict[str, object]:
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30, context=ssl.create_default_context(cafile=cafile)) as resp:
        return json.loads(resp.read() or b"{}")


def register_cluster(base: str, cafile: str, cluster_id: str, apiserver_url: str, apiserver_ca: Path) -> None:
    """Register a cluster as a user does: create it, then PUT its credentials (https only)."""
    _rest(base, cafile, "POST", "/rest/clusters/bcs",
          {"id": cluster_id, "project_id": "bench", "cluster_type": "k8s"})
    _rest(base, cafile, "PUT", f"/rest/clusters/{cluster_id}/credentials",
          {"server_addresses": apiserver_url, "cacert_data": apiserver_ca.read_text(),
           "user_token": "cluster-sa-token-" + "c" * 24})


def start_serve(tmp: Path, name: str, apiserver_url: str, apiserver_ca: Path, extra: Sequence[str] = (),
                package_root: Path | None = None) -> tuple[ServerProcess, dict[str, str]]:
    """``bcs-middleware serve`` with its documented defaults (HTTPS with its generated CA), one
    cluster registered through the REST API, a superuser and a ``view`` user.

    Only the process shape is the bench's: ``--workers/--threads/--worker-class``.
    ``package_root``: run the ``bcs_middleware`` package found there (another checkout: put
    first on ``PYTHONPATH``, it wins over the editable install).
    """
    data_dir = tmp / name
    port = free_port()
    # The view user is one client sending thousands of requests a second: over any per-user
    # limit a real user has (issue 29). It gets its own, so the limits are checked on every
    # request (their cost is measured) and none refuses; everything else is serve's default.
    limits: list[str] = []
    if ((package_root or ROOT) / "bcs_middleware" / "limits").is_dir():  # a tree before issue 29 has none
        limits_file = tmp / f"{name}-limits.yaml"
        limits_file.write_text("users:\n  bench-user: {rate: 1000000, burst: 1000000, inflight: 100000}\n")
        limits = ["--limits-config", str(limits_file)]
    argv = [str(BIN / "bcs-middleware"), "serve", "--data-dir", str(data_dir), *limits,
            "--bind", f"127.0.0.1:{port}", "--workers", str(GUNICORN["workers"]),
            "--threads", str(GUNICORN["threads"]), "--worker-class", str(GUNICORN["worker_class"]),
            *([] if "--reuse-port" in GUNICORN_EXTRA else ["--no-reuse-port"]), *extra]
    env = {"BCS_ADMIN_TOKEN": SERVE_ADMIN}
    if package_root is not None:
        env["PYTHONPATH"] = str(package_root)
    server = ServerProcess(argv, port=port, env=env, scheme="https", timeout=60)
    cafile = str(data_dir / "tls" / "ca.crt")
    base = f"https://localhost:{port}"
    _wait_ready(base + "/healthz", {}, cafile=cafile)
    register_cluster(base, cafile, CLUSTER_ID, apiserver_url, apiserver_ca)
    user = _rest(base, cafile, "POST", "/rest/users/", {"user_name": "bench-user"})
    token = str(_rest(base, cafile, "POST", f"/rest/users/{user['id']}/tokens")["user_token"])
    _rest(base, cafile, "PUT", f"/rest/clusters/{CLUSTER_ID}/permissions/bench-user", {"permission": "view"})
    return server, {"bench-admin": SERVE_ADMIN, "bench-user": token, "base": base, "cafile": cafile}


def _served(ctx: Context) -> tuple[ServerProcess, dict[str, str]]:
    if ctx.served is None:
        ctx.served = start_serve(ctx.tmp, "serve", ctx.nginx_tls_url, ctx.pki.ca_file)
    return ctx.served


def _served_tunnel(ctx: Context, user: str, served: tuple[ServerProcess, dict[str, str]] | None = None
                   ) -> Running:
    server, tokens = served or _served(ctx)
    return Running(tokens["base"] + f"/tunnels/clusters/{CLUSTER_ID}", _gunicorn_tree(server, ctx, True),
                   headers={"Authorization": f"Bearer {tokens[user]}"}, stop=server.stop,
                   workers=_workers(server), cafile=tokens["cafile"])


def start_served_tunnel(ctx: Context) -> Running:
    """``serve``'s tunnel with a superuser token: no impersonation."""
    return _served_tunnel(ctx, "bench-admin")


def start_served_tunnel_impersonate(ctx: Context) -> Running:
    """``serve``'s tunnel with a ``view`` user's token: ``Impersonate-User``/``-Group`` upstream."""
    return _served_tunnel(ctx, "bench-user")


def start_served_tunnel_shared_socket(ctx: Context) -> Running:
    """Diagnostic: ``serve --no-reuse-port`` (every worker accepting from one shared socket)."""
    served = start_serve(ctx.tmp, "serve-shared", ctx.nginx_tls_url, ctx.pki.ca_file, ["--no-reuse-port"])
    return _served_tunnel(ctx, "bench-admin", served)


def tree_contender(name: str, package_root: Path, user: str = "bench-admin") -> Contender:
    """``tunnel`` (``serve``, superuser token) running another checkout's package (``--tree``);
    with ``user`` ``bench-user``, ``tunnel_imp`` (a ``view`` user: impersonation and the per-user limits)."""
    def start(ctx: Context) -> Running:
        # A data directory per contender: tunnel@NAME and tunnel_imp@NAME are two servers.
        served = start_serve(ctx.tmp, f"serve-{name}-{user}", ctx.nginx_tls_url, ctx.pki.ca_file,
                             package_root=package_root)
        return _served_tunnel(ctx, user, served)

    return Contender(f"{'tunnel' if user == 'bench-admin' else 'tunnel_imp'}@{name}", start)


# The headline: the production path. Every name without the http_ prefix is HTTPS end to end.
CONTENDERS = [
    Contender("nginx_proxy", start_nginx_proxy),
    Contender("upstream_proxy", start_tls_upstream_proxy),
    Contender("tunnel", start_served_tunnel),
    Contender("tunnel_imp", start_served_tunnel_impersonate),
    Contender("ceiling", start_tls_ceiling),
]
# Diagnostics over plain HTTP (client and upstream), run only when named in --only or with
# --diagnostics: the WSGI path without TLS, as measured up to session 5.
EXTRA_CONTENDERS = [
    Contender("tunnel_shared_socket", start_served_tunnel_shared_socket),
    Contender("http_nginx", start_nginx_direct),
    Contender("http_upstream_proxy", start_upstream_proxy),
    Contender("http_tunnel", start_tunnel),
    Contender("http_tunnel_imp", start_tunnel_impersonate),
    Contender("http_werkzeug", start_werkzeug),
    Contender("http_ceiling", start_ceiling),
    Contender("http_tunnel_nolog", start_tunnel_no_access_log),
]


# -- load --------------------------------------------------------------------------------------


@dataclass
class Sample:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    cpu_us_per_req: float = 0.0
    upstream_conns_per_req: float | None = None
    # The busiest gunicorn worker's share of the workers' CPU time (0.5 = even with 2 workers).
    busiest_worker_share: float | None = None


def _wrk_ms(text: str) -> float:
    value, unit = re.match(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


# --pin: servers (every contender's processes) on CPU 0, the load generator on CPU 1.
LOADER_CPUS: set[int] | None = None
# --batch-peers: the load generator and the nginx processes under SCHED_BATCH (``chrt -b 0``).
# On these two shared cores, every write the gateway makes wakes wrk or nginx, and the woken
# process preempts the worker mid-request (about two involuntary context switches per proxied
# request, bench/README.md); a batch process does not preempt on wake-up, as a client and an
# apiserver on other machines never do. Every contender runs under the same rule.
PEER_PREFIX: list[str] = []
# The HTTPS gunicorns (ceiling, upstream_proxy) on serve's gevent worker class rather than
# gunicorn's stock one (--stock-gevent turns it off).
SERVE_WORKER = True


def _loader_affinity() -> None:
    if LOADER_CPUS is not None:
        os.sched_setaffinity(0, LOADER_CPUS)


def load_wrk(url: str, headers: dict[str, str], duration: float, connections: int) -> Sample:
    argv = [*PEER_PREFIX, "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "--latency",
            "--timeout", "10s"]
    for name, value in headers.items():
        argv += ["-H", f"{name}: {value}"]
    out = subprocess.run([*argv, url], capture_output=True, text=True, timeout=duration + 30,
                         check=True, preexec_fn=_loader_affinity).stdout
    pct = dict(re.findall(r"^\s+(\d+)%\s+(\S+)", out, re.M))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"{url}: {errors.group(1)} failed responses\n{out}")
    return Sample(
        rps=float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        p50_ms=_wrk_ms(pct["50"]),
        p99_ms=_wrk_ms(pct["99"]),
        requests=int(re.search(r"(\d+) requests in", out).group(1)),  # type: ignore[union-attr]
    )


def load_python(url: str, headers: dict[str, str], duration: float, connections: int) -> Sample:
    """Fallback loader: a child process of threads on keep-alive connections, bounded in time."""
    code = f"""
import http.client, json, threading, time, urllib.parse
u = urllib.parse.urlsplit({url!r}); headers = {headers!r}
lat = []; stop = time.monotonic() + {duration}; lock = threading.Lock()
def run():
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10); mine = []
    while time.monotonic() < stop and len(mine) < 10_000_000:
        t = time.perf_counter(); conn.request("GET", u.path, headers=headers)
        r = conn.getresponse(); r.read(); assert r.status == 200; mine.append(time.perf_counter() - t)
    with lock: lat.extend(mine)
ts = [threading.Thread(target=run) for _ in range({connections})]
start = time.monotonic(); [t.start() for t in ts]; [t.join() for t in ts]
lat.sort(); n = len(lat)
print(json.dumps([n / (time.monotonic() - start), lat[n // 2] * 1e3, lat[int(n * .99)] * 1e3, n]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=duration + 30, check=True).stdout
    rps, p50, p99, n = json.loads(out)
    return Sample(rps, p50, p99, n)


def _wait_ready(url: str, headers: dict[str, str], timeout: float = 60.0, cafile: str | None = None) -> None:
    """gunicorn's master listens before its workers have imported the app: wait for a 200."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            status, _, _ = http_get(url, headers=headers, timeout=5, cafile=cafile)
        except OSError:
            status = 0
        if status == 200:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} is not answering 200 (last status {status})")
        time.sleep(0.2)


def measure(ctx: Context, running: Running, loader: Callable[..., Sample], duration: float,
            connections: int) -> Sample:
    url = running.url + ctx.file_url_path
    pids = running.pids()
    workers = running.workers()
    accepts = ctx.nginx_accepts()
    cpu = _cpu_seconds(pids)
    worker_cpu = [_cpu_seconds([pid]) for pid in workers]
    sample = loader(url, running.headers, duration, connections)
    sample.cpu_us_per_req = (_cpu_seconds(pids) - cpu) / max(sample.requests, 1) * 1e6
    if workers:
        used = [_cpu_seconds([pid]) - before for pid, before in zip(workers, worker_cpu, strict=True)]
        sample.busiest_worker_share = max(used) / sum(used) if sum(used) > 0 else None
    if running.proxied:
        # -1: the stub_status request itself is one accepted connection.
        sample.upstream_conns_per_req = (ctx.nginx_accepts() - accepts - 1) / sample.requests
    return sample


# -- 1 GiB transfers ---------------------------------------------------------------------------


def transfers(ctx: Context) -> dict[str, float]:
    """1 GiB up and down over HTTPS through ``upstream_proxy`` and through ``serve``'s tunnel,
    to an HTTPS upstream that checks the upload's digest."""
    results: dict[str, float] = {}
    cafile = str(ctx.pki.ca_file)
    with FakeUpstream(tls=ctx.pki.server_context()) as fake:
        ini = ctx.tmp / "transfer.ini"
        ini.write_text("[app:main]\nuse = egg:bcs-middleware#upstream_proxy\n"
                       f"upstream = {fake.url}\nca_file = {cafile}\n")
        server = _serve_tls(ctx, str(ini))
        try:
            _transfer(server, server.url, {}, "upstream_proxy", results, cafile)
        finally:
            server.stop()
        server, tokens = start_serve(ctx.tmp, "transfer-serve", fake.url, ctx.pki.ca_file)
        try:
            _transfer(server, f"{tokens['base']}/tunnels/clusters/{CLUSTER_ID}",
                      {"Authorization": f"Bearer {tokens['bench-admin']}"}, "tunnel", results,
                      tokens["cafile"])
        finally:
            server.stop()
    return results


def _transfer(server: ServerProcess, url: str, headers: dict[str, str], label: str,
              results: dict[str, float], cafile: str) -> None:
    import requests

    workers = _children(server.proc.pid)
    requests.get(url + "/echo", headers=headers, timeout=10, verify=cafile).raise_for_status()
    for kind, run in (("upload", _upload), ("download", _download)):
        base = {}
        for pid in workers:
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset VmHWM
            base[pid] = _vm_kib(pid, "VmRSS")
        started = time.monotonic()
        run(url, headers, cafile)
        elapsed = time.monotonic() - started
        growth = max(_vm_kib(pid, "VmHWM") - base[pid] for pid in workers)
        results[f"{label} {kind} peak RSS growth MiB"] = growth / 1024
        results[f"{label} {kind} MiB/s"] = GiB / MiB / elapsed


def _upload(url: str, headers: dict[str, str], cafile: str) -> None:
    import requests

    block = os.urandom(MiB)

    def body():  # type: ignore[no-untyped-def]
        for _ in range(GiB // MiB):
            yield block

    digest = hashlib.sha256()
    for _ in range(GiB // MiB):
        digest.update(block)
    resp = requests.post(url + "/digest", data=body(), headers=headers, timeout=600, verify=cafile)
    assert resp.json() == {"bytes": GiB, "sha256": digest.hexdigest()}, resp.text


def _download(url: str, headers: dict[str, str], cafile: str) -> None:
    import requests

    got = 0
    with requests.get(f"{url}/download?bytes={GiB}", headers=headers, stream=True,
                      timeout=600, verify=cafile) as resp:
        resp.raise_for_status()
        for piece in resp.iter_content(MiB):
            got += len(piece)
    assert got == GiB


# -- report ----------------------------------------------------------------------------------


def _report(title: str, samples: dict[str, list[Sample]]
            ) -> tuple[dict[str, dict[str, float | None]], dict[str, float]]:
    """Print one view's medians and median per-round ratios; return both."""
    print(f"\n== {title}\n")
    print(f"{'contender':15} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU us/req':>11} "
          f"{'upstream conn/req':>18} {'busiest worker':>15}")
    med: dict[str, dict[str, float | None]] = {}
    for name, items in samples.items():
        conns = [s.upstream_conns_per_req for s in items if s.upstream_conns_per_req is not None]
        shares = [s.busiest_worker_share for s in items if s.busiest_worker_share is not None]
        med[name] = {
            "rps": statistics.median(s.rps for s in items),
            "p50_ms": statistics.median(s.p50_ms for s in items),
            "p99_ms": statistics.median(s.p99_ms for s in items),
            "cpu_us_per_req": statistics.median(s.cpu_us_per_req for s in items),
            "upstream_conns_per_req": statistics.median(conns) if conns else None,
            "busiest_worker_share": statistics.median(shares) if shares else None,
            "busiest_worker_share_max": max(shares) if shares else None,
        }
        m = med[name]
        conn_text = f"{m['upstream_conns_per_req']:.4f}" if conns else "-"
        share_text = (f"{m['busiest_worker_share']:.2f} (max {m['busiest_worker_share_max']:.2f})"
                      if shares else "-")
        print(f"{name:15} {m['rps']:9.0f} {m['p50_ms']:8.2f} {m['p99_ms']:8.2f} "
              f"{m['cpu_us_per_req']:11.0f} {conn_text:>18} {share_text:>15}")

    def ratio(a: str, b: str, key: str = "rps") -> float:
        return statistics.median(
            getattr(x, key) / getattr(y, key) for x, y in zip(samples[a], samples[b], strict=True)
        )

    names = set(samples)
    pairs = [(a, b) for a, b in (
        ("upstream_proxy", "ceiling"), ("tunnel", "ceiling"), ("tunnel_imp", "ceiling"),
        ("nginx_proxy", "ceiling"), ("upstream_proxy", "nginx_proxy"), ("tunnel", "nginx_proxy"),
        ("tunnel_imp", "nginx_proxy"), ("tunnel", "upstream_proxy"),
        ("http_upstream_proxy", "http_ceiling"), ("http_upstream_proxy", "http_werkzeug"),
        ("http_tunnel", "http_ceiling"), ("http_tunnel", "http_werkzeug"),
        ("http_tunnel_imp", "http_ceiling"), ("http_werkzeug", "http_ceiling"),
        ("http_tunnel", "http_tunnel_nolog"), ("tunnel", "http_tunnel"), ("ceiling", "http_ceiling"),
        ("tunnel", "tunnel_shared_socket"),
    ) if a in names and b in names]
    ratios = {f"{a}/{b} req/s": ratio(a, b) for a, b in pairs}
    for a, b in pairs:
        if "nginx" not in a + b and "werkzeug" not in a and "shared" not in b:
            ratios[f"{a}/{b} CPU/req"] = ratio(a, b, "cpu_us_per_req")
    print("\nmedian of per-round ratios")
    for name, value in ratios.items():
        print(f"  {name:34} {value:6.2f}")
    return med, ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--connections", default="16,64",
                        help="comma-separated concurrency levels, each measured for every contender "
                             "in every round (default 16,64); the targets use each contender's best "
                             "level per round (its capacity)")
    parser.add_argument("--loader", choices=["wrk", "python"],
                        default="wrk" if shutil.which("wrk") else "python")
    parser.add_argument("--skip-transfers", action="store_true")
    parser.add_argument("--diagnostics", action="store_true",
                        help="also run the plain-HTTP diagnostic contenders (http_*)")
    parser.add_argument("--switch-interval", type=float,
                        help="sys.setswitchinterval() in every gunicorn worker (post_fork)")
    parser.add_argument("--only", help="comma-separated contenders to run (default: all)")
    parser.add_argument("--workers", type=int, default=GUNICORN["workers"],
                        help="gunicorn workers, the same for every contender")
    parser.add_argument("--threads", type=int, default=GUNICORN["threads"],
                        help="gunicorn threads per worker, the same for every contender")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--worker-class", default=GUNICORN["worker_class"],
                        help="gunicorn worker class, the same for every contender (gthread, gevent, ...)")
    parser.add_argument("--shared-socket", action="store_true",
                        help="all gunicorn workers accept from one shared socket (gunicorn's default) "
                             "instead of --reuse-port: shows the accept imbalance")
    parser.add_argument("--stock-gevent", action="store_true",
                        help="the HTTPS ceiling and upstream_proxy on gunicorn's own gevent worker "
                             "instead of serve's (bcs_middleware.serving.gevent_worker.GatewayGeventWorker)")
    parser.add_argument("--batch-peers", action="store_true",
                        help="run wrk and every nginx under SCHED_BATCH: they no longer preempt the "
                             "servers when a write wakes them (as peers on other machines)")
    parser.add_argument("--pin", action="store_true",
                        help="servers of every contender on CPU 0, the load generator on CPU 1: "
                             "steadier ratios on a 2-CPU machine")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                        help="add contender tunnel@NAME: serve's tunnel running the package of the "
                             "checkout DIR (repeatable; an interleaved A/B of two versions of the code)")
    parser.add_argument("--tree-imp", action="store_true",
                        help="with --tree, also tunnel_imp@NAME: the view user's path of that checkout")
    args = parser.parse_args()
    if args.stock_gevent:
        global SERVE_WORKER
        SERVE_WORKER = False
    if args.batch_peers:
        PEER_PREFIX.extend(["chrt", "-b", "0"])
    if args.pin:
        global LOADER_CPUS
        LOADER_CPUS = {1}
        os.sched_setaffinity(0, {0})  # every server started from here inherits CPU 0
    if args.shared_socket:
        GUNICORN_EXTRA.remove("--reuse-port")
    loader = load_wrk if args.loader == "wrk" else load_python
    GUNICORN.update(workers=args.workers, threads=args.threads, worker_class=args.worker_class)
    contenders = [*CONTENDERS, *(EXTRA_CONTENDERS if args.diagnostics else [])]
    if args.only:
        contenders = [c for c in CONTENDERS + EXTRA_CONTENDERS if c.name in args.only.split(",")]
    for tree in args.tree:
        tree_name, _, tree_dir = tree.partition("=")
        contenders.append(tree_contender(tree_name, Path(tree_dir).resolve()))
        if args.tree_imp:
            contenders.append(tree_contender(tree_name, Path(tree_dir).resolve(), user="bench-user"))

    tmp = Path(tempfile.mkdtemp(prefix="proxy-bench-"))
    tmp.chmod(0o755)  # nginx workers run as an unprivileged user when started by root
    if args.switch_interval:
        GUNICORN_EXTRA.extend(["-c", str(_switch_interval_config(tmp, args.switch_interval))])
    pki = Pki.create(tmp)
    tls_port = free_port()
    nginx = _start_nginx(tmp, pki, tls_port)
    ctx = Context(tmp, "/payload.bin", nginx, f"{nginx.url}/nginx_status", pki,
                  f"https://127.0.0.1:{tls_port}")
    levels = [int(level) for level in str(args.connections).split(",")]
    running: dict[str, Running] = {}
    # samples[level][contender]: one Sample per round.
    samples: dict[int, dict[str, list[Sample]]] = {
        level: {c.name: [] for c in contenders} for level in levels}
    try:
        for contender in contenders:
            running[contender.name] = contender.start(ctx)
            _wait_ready(running[contender.name].url + ctx.file_url_path, running[contender.name].headers,
                        cafile=running[contender.name].cafile)
            measure(ctx, running[contender.name], loader, 1.0, max(levels))  # warm up
        for round_no in range(args.rounds):
            for contender in contenders:
                for level in levels:
                    sample = measure(ctx, running[contender.name], loader, args.duration, level)
                    samples[level][contender.name].append(sample)
                    share = sample.busiest_worker_share
                    print(f"round {round_no + 1} {contender.name:15} c{level:<4} {sample.rps:9.0f} req/s "
                          f"p50 {sample.p50_ms:6.2f} ms p99 {sample.p99_ms:6.2f} ms "
                          f"cpu {sample.cpu_us_per_req:6.0f} us/req"
                          f"{f'  busiest worker {share:.2f}' if share is not None else ''}", flush=True)
    finally:
        for item in running.values():
            item.stop()
        nginx.stop()

    print(f"\nloader {args.loader}, {args.connections} connections, {args.rounds} rounds x "
          f"{args.duration:g} s, body {BODY_SIZE} B, gunicorn -w {GUNICORN['workers']} "
          f"-k {GUNICORN['worker_class']} --threads {GUNICORN['threads']} "
          f"{' '.join(GUNICORN_EXTRA)}"
          f"{f', switch interval {args.switch_interval:g} s' if args.switch_interval else ''}, "
          f"{os.cpu_count()} CPUs")
    # Capacity: in each round, each contender's best level. A contender that waits on an
    # upstream is latency-bound at a concurrency that already saturates the CPUs for one
    # that never waits (bench/README.md, "Why a concurrency sweep").
    best = {name: [max((samples[level][name][i] for level in levels), key=lambda x: x.rps)
                   for i in range(args.rounds)] for name in samples[levels[0]]}
    views: list[tuple[str, dict[str, list[Sample]]]] = [
        (f"{level} connections", samples[level]) for level in levels]
    if len(levels) > 1:
        views.append(("capacity: each contender's best level per round", best))
    med: dict[str, dict[str, dict[str, float | None]]] = {}
    ratios_by_view: dict[str, dict[str, float]] = {}
    for title, view in views:
        med[title], ratios_by_view[title] = _report(title, view)
    ratios = ratios_by_view[views[-1][0]]
    capacity = med[views[-1][0]]

    settings = {**GUNICORN, "switch_interval": args.switch_interval, "extra": GUNICORN_EXTRA,
                "connections": levels}
    result: dict[str, object] = {"medians": med, "ratios": ratios_by_view, "settings": settings}
    targets: dict[str, bool] = {}
    for name, goal in (("upstream_proxy/ceiling req/s", 0.6), ("agent_tunnel/ceiling req/s", 0.5),
                       ("tunnel_imp/ceiling req/s", 0.45)):
        if name in ratios:
            targets[f"{name} >= {goal}"] = ratios[name] >= goal
    for name in ("upstream_proxy", "tunnel", "tunnel_imp"):
        if name in capacity:
            targets[f"{name} upstream conn/req <= 0.01"] = (
                (capacity[name]["upstream_conns_per_req"] or 0) <= 0.01)
    if not args.skip_transfers:
        moved = transfers(ctx)
        result["transfers"] = moved
        print("\n1 GiB through the proxies")
        for name, value in moved.items():
            print(f"  {name:40} {value:8.1f}")
        targets["peak RSS growth < 32 MiB"] = max(
            value for name, value in moved.items() if "RSS" in name) < 32
    print(f"\ntargets ({views[-1][0]})")
    for name, ok in targets.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    result["targets"] = targets
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if all(targets.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
