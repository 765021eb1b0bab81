"""``bcs-middleware kube-agent``: report a cluster's apiserver credentials to the gateway.

Runs inside the cluster (a Deployment, see ``examples/kube-agent.yaml``) or beside
it with ``--kubeconfig``. Every ``--periodsync`` seconds it gathers

* the apiserver addresses — ``--external-proxy-addresses`` if given, else the
  ``default/kubernetes`` Endpoints (``https://ip:port`` of each ready address),
  else the kubeconfig's server;
* the cluster CA and the service-account token — from the standard mount
  (``/var/run/secrets/kubernetes.io/serviceaccount``) or the kubeconfig;

and PUTs them to ``{bke-address}/rest/clusters/{cluster-id}/credentials``,
authenticated by the cluster's register token (env ``REGISTER_TOKEN``). The
gateway's certificate is verified against env ``SERVER_CERT`` (PEM, or a path to
one); ``--insecure-skip-verify`` turns that off and says so at every report.

On failure it logs the gateway's ``code_name`` and message and retries with
exponential backoff (capped at the period). It never logs a token.

With ``--tunnel`` it reports nothing by HTTP: it holds a WebSocket tunnel to the
gateway instead (see :mod:`bcs_middleware.agent_tunnel.agent`), for clusters the gateway
cannot reach. The apiserver it serves through the tunnel is the ``kubernetes``
service in a cluster, the kubeconfig's server outside; ``--periodsync`` is then how
often it checks whether its CA or token changed (and reconnects to report them).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import os
import random
import signal
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import urllib3
import yaml

from ..agent_tunnel.agent import MAX_CONNECTIONS, REPLACED_BACKOFF, TunnelAgent
from ..agent_tunnel.agent import client_context as tunnel_client_context
from ..agent_tunnel.handshake import TunnelParams

log = logging.getLogger("bcs_middleware.cli.kube_agent")

DESCRIPTION = "Report this cluster's apiserver addresses, CA and service-account token to a gateway, periodically."
ENVIRONMENT = """environment:
  REGISTER_TOKEN  the cluster's register token (POST /rest/clusters/ID/register_tokens); required
                  unless --client-cert
  SERVER_CERT     the CA the gateway's certificate chains to: PEM text or a file path
                  (the gateway's data_dir/tls/ca.crt); default: the system trust store
"""

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TIMEOUT = (5.0, 20.0)
#: The most of a gateway's refusal read (its JSON error is a few hundred bytes; a hostile or
#: broken gateway may send any amount).
MAX_ANSWER = 64 * 1024
#: The most of the gateway's error message logged.
MAX_DETAIL = 300

#: The signals that stop the agent: an init system's SIGTERM, a terminal's Ctrl-C.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: How long a stopping tunnel agent waits for its connections to close before it exits.
STOP_GRACE = 2.0


class Stopped(BaseException):
    """A stop signal arrived (not an error: the agent exits 0). A ``BaseException``, like
    ``KeyboardInterrupt``: it must pass every ``except Exception`` on its way out."""


def _raise_stopped(signum: int, frame: Any) -> None:
    for other in STOP_SIGNALS:  # once: the way out (closing the session) is not interrupted
        signal.signal(other, signal.SIG_IGN)
    raise Stopped(signal.Signals(signum).name)


@dataclass(frozen=True)
class ClusterAccess:
    """What the agent reports. ``token`` is a secret: never logged."""

    addresses: tuple[str, ...]
    ca_pem: str
    token: str = field(repr=False)


class AgentError(Exception):
    """A report could not be made; the message is safe to log."""


def _pem_file(pem: str) -> str:
    handle = tempfile.NamedTemporaryFile("w", suffix=".pem", delete=False)  # noqa: SIM115
    with handle:
        handle.write(pem)
    return handle.name


def _endpoint_addresses(server: str, ca_pem: str, token: str, insecure: bool) -> list[str]:
    """``https://ip:port`` for each address of the ``default/kubernetes`` Endpoints."""
    ca_file = _pem_file(ca_pem)
    try:
        resp = requests.get(
            f"{server.rstrip('/')}/api/v1/namespaces/default/endpoints/kubernetes",
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            verify=False if insecure else ca_file,
            timeout=TIMEOUT,
            allow_redirects=False,
        )
    except requests.RequestException as exc:
        raise AgentError(f"cannot read default/kubernetes endpoints: {type(exc).__name__}") from None
    finally:
        os.unlink(ca_file)
    if resp.status_code != 200:
        raise AgentError(f"reading default/kubernetes endpoints: HTTP {resp.status_code}")
    addresses = []
    for subset in resp.json().get("subsets") or []:
        ports = [p for p in subset.get("ports") or [] if p.get("name", "https") == "https"] or subset.get("ports") or []
        for address in subset.get("addresses") or []:
            for port in ports:
                ip = address["ip"]
                host = f"[{ip}]" if ":" in ip else ip
                addresses.append(f"https://{host}:{port['port']}")
    return addresses


def discover_in_cluster(sa_dir: Path | None = None) -> tuple[str, str, str]:
    sa_dir = sa_dir or SA_DIR
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host or not (sa_dir / "token").exists():
        raise AgentError("not running in a cluster (no KUBERNETES_SERVICE_HOST or service-account mount); "
                         "pass --kubeconfig")
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return server, (sa_dir / "ca.crt").read_text(), (sa_dir / "token").read_text().strip()


def discover_from_kubeconfig(path: Path, context: str | None = None, *,
                             service_account: str = "kube-system/bcs-kube-agent") -> tuple[str, str, str]:
    """The apiserver, CA and bearer token of ``path``'s (current) context.

    A user with a client certificate and no token (kind, minikube) gets a token of
    ``service_account`` through the TokenRequest API, which the gateway then uses.
    """
    config = yaml.safe_load(path.read_text()) or {}
    name = context or config.get("current-context")
    ctx = next((c["context"] for c in config.get("contexts", []) if c["name"] == name), None)
    if ctx is None:
        raise AgentError(f"kubeconfig {path}: no context {name!r}")
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == ctx["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == ctx["user"])
    if "certificate-authority-data" in cluster:
        ca_pem = base64.b64decode(cluster["certificate-authority-data"]).decode()
    elif "certificate-authority" in cluster:
        ca_pem = (path.parent / cluster["certificate-authority"]).read_text()
    else:
        raise AgentError(f"kubeconfig {path}: the cluster has no certificate authority")
    token = user.get("token") or (Path(user["tokenFile"]).read_text().strip() if "tokenFile" in user else "")
    if token:
        return cluster["server"], ca_pem, token
    cert_pem = _kubeconfig_pem(path, user, "client-certificate")
    key_pem = _kubeconfig_pem(path, user, "client-key")
    if cert_pem is None or key_pem is None:
        raise AgentError(f"kubeconfig {path}: the user has neither a bearer token nor a client certificate")
    # The gateway forwards with a bearer token, never with this certificate: ask the
    # cluster for a service account's token with it (kind and minikube kubeconfigs).
    token = service_account_token(cluster["server"], ca_pem, (cert_pem, key_pem), service_account)
    return cluster["server"], ca_pem, token


def _kubeconfig_pem(path: Path, user: dict[str, Any], key: str) -> str | None:
    if f"{key}-data" in user:
        return base64.b64decode(user[f"{key}-data"]).decode()
    if key in user:
        return (path.parent / user[key]).read_text()
    return None


#: ``(server, namespace/name)`` → (token, monotonic time to ask again): one TokenRequest
#: per half of the token's life, not one per report.
_TOKENS: dict[tuple[str, str], tuple[str, float]] = {}
TOKEN_SECONDS = 24 * 3600


def service_account_token(server: str, ca_pem: str, client_cert: tuple[str, str], service_account: str) -> str:
    """A token of ``service_account`` (``namespace/name``) by TokenRequest, authenticated by ``client_cert``."""
    namespace, _, name = service_account.partition("/")
    if not namespace or not name:
        raise AgentError(f"--service-account {service_account!r}: expected NAMESPACE/NAME")
    cached = _TOKENS.get((server, service_account))
    if cached is not None and time.monotonic() < cached[1]:
        return cached[0]
    files = [_pem_file(ca_pem), _pem_file(client_cert[0]), _pem_file(client_cert[1])]
    try:
        resp = requests.post(
            f"{server.rstrip('/')}/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                  "spec": {"expirationSeconds": TOKEN_SECONDS}},
            verify=files[0], cert=(files[1], files[2]), timeout=TIMEOUT, allow_redirects=False,
        )
    except requests.RequestException as exc:
        raise AgentError(f"cannot request a token for {service_account}: {type(exc).__name__}") from None
    finally:
        for file in files:
            os.unlink(file)
    if resp.status_code == 404:
        raise AgentError(
            f"service account {service_account} does not exist; create it with the rights the gateway "
            f"needs: kubectl -n {namespace} create serviceaccount {name} && kubectl create clusterrolebinding "
            f"{name} --clusterrole=cluster-admin --serviceaccount={namespace}:{name}"
        )
    if resp.status_code not in (200, 201):
        raise AgentError(f"requesting a token for {service_account}: HTTP {resp.status_code}")
    token = str((resp.json().get("status") or {}).get("token") or "")
    if not token:
        raise AgentError(f"requesting a token for {service_account}: the answer has no token")
    _TOKENS[(server, service_account)] = (token, time.monotonic() + TOKEN_SECONDS / 2)
    log.info("obtained a %dh token for service account %s with the kubeconfig's client certificate",
             TOKEN_SECONDS // 3600, service_account)
    return token


def gather(args: argparse.Namespace) -> ClusterAccess:
    if args.kubeconfig:
        server, ca_pem, token = discover_from_kubeconfig(Path(args.kubeconfig),
                                                         service_account=args.service_account)
    else:
        server, ca_pem, token = discover_in_cluster()
    if args.external_proxy_addresses:
        addresses = [a.strip() for a in args.external_proxy_addresses.split(";") if a.strip()]
    else:
        try:
            addresses = _endpoint_addresses(server, ca_pem, token, args.insecure_skip_verify)
        except AgentError as exc:
            log.warning("%s; reporting %s instead", exc, server)
            addresses = []
        addresses = addresses or [server]
    return ClusterAccess(tuple(addresses), ca_pem, token)


class Reporter:
    def __init__(self, gateway: str, cluster_id: str, register_token: str, *, server_cert: str | None,
                 insecure: bool, client_cert: tuple[str, str] | None = None) -> None:
        self.url = f"{gateway.rstrip('/')}/rest/clusters/{cluster_id}/credentials"
        self.register_token = register_token
        self.insecure = insecure
        self.session = requests.Session()
        self.session.trust_env = False
        if client_cert is not None:
            self.session.cert = client_cert
        self.verify: Any = True
        if insecure:
            self.verify = False
        elif server_cert:
            pem = Path(server_cert).read_text() if "BEGIN CERTIFICATE" not in server_cert else server_cert
            self.verify = _pem_file(pem)

    def close(self) -> None:
        """Close the session and remove the CA file written for it."""
        self.session.close()
        if isinstance(self.verify, str):
            with contextlib.suppress(OSError):
                os.unlink(self.verify)

    def report(self, access: ClusterAccess) -> None:
        if self.insecure:
            log.warning("--insecure-skip-verify: the gateway's certificate is NOT verified")
        body = {"server_addresses": ";".join(access.addresses), "cacert_data": access.ca_pem,
                "user_token": access.token}
        try:
            headers = {"Authorization": f"Bearer {self.register_token}"} if self.register_token else {}
            # Streamed: only the start of an answer is read (MAX_ANSWER), whatever its length.
            resp = self.session.put(self.url, json=body, timeout=TIMEOUT, verify=self.verify, headers=headers,
                                    allow_redirects=False, stream=True)
        except requests.exceptions.SSLError:
            raise AgentError("the gateway's certificate did not verify against SERVER_CERT") from None
        except requests.RequestException as exc:
            raise AgentError(f"cannot reach the gateway: {type(exc).__name__}") from None
        with resp:
            if resp.status_code != 200:
                raise AgentError(f"gateway refused the report (HTTP {resp.status_code}) {_refusal(resp)}")
        log.info("reported %d apiserver address(es) for the cluster", len(access.addresses))


def _refusal(resp: requests.Response) -> str:
    """``code_name: message`` of the gateway's JSON error, from at most :data:`MAX_ANSWER` bytes of it."""
    try:
        start = resp.raw.read(MAX_ANSWER, decode_content=True)
        err = json.loads(start)
        detail = f"{err.get('code_name')}: {err.get('message')}"
    except (ValueError, AttributeError, OSError, urllib3.exceptions.HTTPError):
        # Not JSON, cut short at MAX_ANSWER, or not an object; or the connection failed.
        return resp.reason or "no details"
    return detail[:MAX_DETAIL]


def gather_tunnel(args: argparse.Namespace) -> TunnelParams:
    """What a tunnelling agent reports: the apiserver it dials (the ``kubernetes`` service in a
    cluster, the kubeconfig's server outside), its CA and the service-account token."""
    if args.kubeconfig:
        server, ca_pem, token = discover_from_kubeconfig(Path(args.kubeconfig), service_account=args.service_account)
    else:
        server, ca_pem, token = discover_in_cluster()
    return TunnelParams(address=server, user_token=token, ca_pem=ca_pem)


def run_tunnel(args: argparse.Namespace, register_token: str, server_cert: str | None,
               client_cert: tuple[str, str] | None) -> int:
    if args.once:
        log.error("--once does not apply to --tunnel (the tunnel is held open)")
        return 2
    if args.external_proxy_addresses:
        log.warning("--external-proxy-addresses is ignored with --tunnel: the gateway reaches the apiserver "
                    "through this agent")
    if not args.bke_address.startswith("https://"):
        log.error("--tunnel needs an https:// --bke-address")
        return 2
    if args.insecure_skip_verify:
        log.warning("--insecure-skip-verify: the gateway's certificate is NOT verified")
    agent = TunnelAgent(
        gateway_url=args.bke_address, cluster_id=args.cluster_id, register_token=register_token,
        gather=lambda: gather_tunnel(args),
        context=tunnel_client_context(server_cert=server_cert, insecure=args.insecure_skip_verify,
                                      client_cert=client_cert),
        refresh=float(args.periodsync), replaced_backoff=float(args.replaced_backoff),
        connections=args.tunnel_connections,
    )
    # Ctrl-C (SIGINT) and SIGTERM stop the agent the same way: its connections are closed (the
    # gateway learns at once) and it exits 0. The agent runs in a thread of its own (a greenlet
    # under gevent) and the main one only waits for it: stop() never runs inside agent code,
    # which may hold the lock stop() takes.
    from gevent import monkey

    if monkey.is_module_patched("socket"):
        import gevent

        for signum in STOP_SIGNALS:  # stop() in a greenlet of its own
            gevent.signal_handler(signum, agent.stop)
    else:
        for signum in STOP_SIGNALS:  # runs in the main thread, which only waits
            signal.signal(signum, lambda *_: agent.stop())
    runner = threading.Thread(target=agent.run, name="bcs-tunnel-agent", daemon=True)
    runner.start()
    while runner.is_alive() and not agent.stopping:
        runner.join(0.2)
    # A connection still being dialled (the gateway's TCP connect) is given up, not waited for.
    runner.join(STOP_GRACE)
    return 0


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    register_token = os.environ.get("REGISTER_TOKEN", "").strip()
    client_cert = (args.client_cert, args.client_key or args.client_cert) if args.client_cert else None
    if not register_token and client_cert is None:
        log.error("env REGISTER_TOKEN is not set (nor --client-cert)")
        return 2
    if not args.bke_address.startswith("https://") and not args.insecure_skip_verify:
        log.error("--bke-address must be https:// (the register token must not cross the network in clear)")
        return 2
    server_cert = os.environ.get("SERVER_CERT")
    if not server_cert and not args.insecure_skip_verify:
        log.info("env SERVER_CERT not set: verifying the gateway against the system trust store")
    if args.tunnel:
        return run_tunnel(args, register_token, server_cert, client_cert)
    # Reporting: a stop signal ends whatever the agent is doing (a report in flight, the wait
    # before the next one), as Ctrl-C interrupts any Python program, but quietly and with 0.
    for signum in STOP_SIGNALS:
        signal.signal(signum, _raise_stopped)
    reporter = Reporter(args.bke_address, args.cluster_id, register_token, server_cert=server_cert,
                        insecure=args.insecure_skip_verify, client_cert=client_cert)
    try:
        return _report(args, reporter)
    except Stopped as stop:
        log.info("%s: stopping", stop)
        return 0
    finally:
        reporter.close()


def _report(args: argparse.Namespace, reporter: Reporter) -> int:
    """Report every ``--periodsync`` seconds (once with ``--once``), retrying failures with backoff."""
    failures = 0
    reports = 0
    while True:
        try:
            reporter.report(gather(args))
            failures = 0
            reports += 1
            delay = float(args.periodsync)
        except AgentError as exc:
            failures += 1
            log.error("report failed: %s", exc)
            if args.once:
                return 1
            delay = min(float(args.periodsync), 2.0 ** min(failures, 8)) * random.uniform(0.8, 1.2)  # noqa: S311
        if args.once and reports:
            return 0
        time.sleep(delay)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bke-address", required=True, metavar="URL",
                        help="the gateway's base URL (https://…); the register token never crosses plain HTTP")
    parser.add_argument("--cluster-id", required=True, metavar="ID",
                        help="the cluster this agent reports for, as created on the gateway (POST /rest/clusters/bcs)")
    parser.add_argument("--periodsync", type=int, default=60, metavar="SECONDS",
                        help="seconds between reports (default 60); failures retry sooner, with backoff")
    parser.add_argument("--external-proxy-addresses", metavar="URL;URL",
                        help="';'-separated apiserver URLs to report instead of the default/kubernetes Endpoints")
    parser.add_argument("--kubeconfig", metavar="FILE",
                        help="outside a cluster: where the apiserver, CA and token come from; a user with a client "
                             "certificate and no token (kind, minikube) gets a --service-account token instead")
    parser.add_argument("--service-account", default="kube-system/bcs-kube-agent", metavar="NAMESPACE/NAME",
                        help="with a client-certificate kubeconfig: the service account whose token (TokenRequest, "
                             "24h, renewed at half-life) the gateway uses (default kube-system/bcs-kube-agent)")
    parser.add_argument("--insecure-skip-verify", action="store_true",
                        help="do not verify the gateway's certificate (logged at every report)")
    parser.add_argument("--client-cert", metavar="FILE",
                        help="present this client certificate to the gateway (instead of REGISTER_TOKEN, when the "
                             "gateway maps its subject to this cluster: serve --client-cert-map)")
    parser.add_argument("--client-key", metavar="FILE", help="the key of --client-cert (default: in the same file)")
    parser.add_argument("--once", action="store_true", help="report once and exit (0 on success, 1 on failure)")
    parser.add_argument("--tunnel", action="store_true",
                        help="hold a WebSocket tunnel to the gateway (/bcsapi/v1/websocket/connect) instead of "
                             "reporting addresses: for clusters the gateway cannot reach; the gateway then reaches "
                             "this cluster's apiserver, and only it, through the agent")
    parser.add_argument("--tunnel-connections", type=_connections, default=None, metavar="auto|N",
                        help="with --tunnel: how many connections to hold to the gateway (default auto: one per "
                             f"gateway worker, as the gateway says, at most {MAX_CONNECTIONS}), so that no worker "
                             "forwards its requests to the one holding the agent")
    parser.add_argument("--io", choices=("gevent", "threads"), default="gevent",
                        help="with --tunnel: carry the tunnel's streams in gevent greenlets (default; the "
                             "bcs-middleware command patches the process at start) or in OS threads")
    parser.add_argument("--replaced-backoff", type=float, default=REPLACED_BACKOFF, metavar="SECONDS",
                        help="with --tunnel: how long to wait before reconnecting after another agent of the cluster "
                             f"replaced this one at the gateway (default {REPLACED_BACKOFF:g}; run one replica)")


def _connections(value: str) -> int | None:
    if value == "auto":
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_CONNECTIONS:
        raise argparse.ArgumentTypeError(f"must be auto or a number from 1 to {MAX_CONNECTIONS}")
    return number


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bcs-middleware kube-agent", description=DESCRIPTION,
                                     epilog=ENVIRONMENT, formatter_class=argparse.RawDescriptionHelpFormatter)
    configure_parser(parser)
    return run(parser.parse_args(argv))
