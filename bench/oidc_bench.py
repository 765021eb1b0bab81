"""An identity-provider user against a gateway-token user on the production path, interleaved.

One ``bcs-middleware serve`` (its defaults: gevent, 2 workers, HTTPS) with an
``AuthenticationConfiguration`` naming a real OpenID provider (``oidc-provider-mock`` on
HTTPS), a fake apiserver registered as a cluster, and two callers with ``view`` on it:
a gateway-token user (a per-user grant) and a provider user (a group grant). Each round
sends the same ``GET`` through the tunnel (impersonated for both) from ``--connections``
keep-alive HTTPS connections for ``--duration`` seconds, alternating who goes first; the
report is each one's requests per second and the ratio OIDC / token (the identity cache
makes a verified JWT cost a lookup, as a gateway token's cache does).

    python bench/oidc_bench.py [--rounds 5] [--duration 5] [--connections 16]
"""

from __future__ import annotations

import argparse
import http.client
import json
import ssl
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import trustme

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import SA_TOKEN, gateway_ini, register_cluster, served_gateway
from tests.support.oidc_provider import served_provider

CLUSTER = "BCS-K8S-BENCH"
PATH = f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/configmaps"


def load(port: int, ca_file: str, token: str, connections: int, duration: float) -> float:
    """Requests per second from ``connections`` keep-alive connections for ``duration`` seconds."""
    context = ssl.create_default_context(cafile=ca_file)
    counts = [0] * connections
    stop = time.monotonic() + duration

    def run(index: int) -> None:
        conn = http.client.HTTPSConnection("localhost", port, context=context, timeout=30)
        headers = {"Authorization": f"Bearer {token}"}
        while time.monotonic() < stop:
            conn.request("GET", PATH, headers=headers)
            answer = conn.getresponse()
            answer.read()
            if answer.status != 200:
                raise RuntimeError(f"HTTP {answer.status}")
            counts[index] += 1
        conn.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(connections)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.monotonic() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="oidc-bench-"))
    ca = trustme.CA()
    with served_provider(tmp / "provider", ca) as provider, FakeAPIServer(token=SA_TOKEN) as api:
        auth = tmp / "authentication.json"
        auth.write_text(json.dumps({
            "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AuthenticationConfiguration",
            "jwt": [{"issuer": {"url": provider.issuer, "audiences": ["bench"],
                                "certificateAuthority": ca.cert_pem.bytes().decode()},
                     "claimMappings": {"username": {"claim": "sub", "prefix": "idp:"},
                                       "groups": {"claim": "groups", "prefix": ""}}}]}))
        # Both users get limits they cannot reach (issue 29's per-user limits are on by default):
        # the bench compares the cost of the two credentials, not who is refused first.
        limits = tmp / "limits.yaml"
        limits.write_text("users:\n" + "".join(f"  {user}: {{rate: 1000000, burst: 1000000, inflight: 100000}}\n"
                                                for user in ("bench-token", "idp:bench-oidc")))
        data = tmp / "data"
        ini = gateway_ini(tmp / "gateway.ini", data, authentication_config=str(auth), access_log="false",
                          limits_config=str(limits))
        with served_gateway(data, args=["--config", str(ini)]) as gw:
            register_cluster(gw, CLUSTER, server_url=api.url, ca_pem=api.ca_pem)
            token_user = gw.user("bench-token")
            gw.grant("bench-token", "view", cluster=CLUSTER)
            gw.json("PUT", f"/rest/clusters/{CLUSTER}/group_permissions/bench", body={"permission": "view"})
            jwt = provider.id_token("bench-oidc", client_id="bench", claims={"groups": ["bench"]})
            port = gw.server.port
            for token in (token_user, jwt):  # warm both caches and connections
                load(port, gw.ca_file, token, args.connections, 1.0)
            results: dict[str, list[float]] = {"token": [], "oidc": []}
            for round_ in range(args.rounds):
                order = ("token", "oidc") if round_ % 2 == 0 else ("oidc", "token")
                for name in order:
                    rate = load(port, gw.ca_file, token_user if name == "token" else jwt, args.connections,
                                args.duration)
                    results[name].append(rate)
                print(f"round {round_ + 1}: token {results['token'][-1]:.0f}/s  oidc {results['oidc'][-1]:.0f}/s",
                      flush=True)
    token_rate, oidc_rate = statistics.median(results["token"]), statistics.median(results["oidc"])
    ratios = [o / t for o, t in zip(results["oidc"], results["token"], strict=True)]
    print(f"median: token {token_rate:.0f}/s  oidc {oidc_rate:.0f}/s  ratio oidc/token {oidc_rate / token_rate:.3f}"
          f"  (per-round ratios {', '.join(f'{r:.2f}' for r in ratios)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
