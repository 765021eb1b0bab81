"""``parse_tunnel_path``: the check and re-encoding of a tunnel path, remembered per path.

Paths a client repeats come from a bounded cache; a refusal must be refused every
time, and a path too long to be cached must get exactly the same answer.
"""

from __future__ import annotations

import pytest

from bcs_middleware.core.errors import BadRequest
from bcs_middleware.core.impersonation import Impersonation, impersonation_headers
from bcs_middleware.core.paths import TunnelPath, _parse_tunnel_path, _parsed, parse_tunnel_path

PREFIX = "/tunnels/clusters/BCS-K8S-1"


@pytest.mark.parametrize("path, raw", [
    (f"{PREFIX}/api/../../rest", None),
    (f"{PREFIX}/./version", None),
    (f"{PREFIX}/api/v1/x", f"{PREFIX}/api%2Fv1/x"),
    (f"{PREFIX}/api/v1/x", f"{PREFIX}/api%5cv1/x"),
    (f"{PREFIX}/a\\b", None),
    ("/tunnels/clusters//version", None),
])
def test_unsafe_paths_are_refused_every_time(path: str, raw: str | None) -> None:
    for _ in range(3):
        with pytest.raises(BadRequest):
            parse_tunnel_path(path, raw)


def test_a_path_outside_the_tunnel_prefix_is_not_a_tunnel() -> None:
    assert parse_tunnel_path("/rest/clusters", None) is None


@pytest.mark.parametrize("rest", ["api/v1/pods", "api/v1/namespaces/a b/pods", "apis/x/v1/ns/é"])
def test_long_paths_get_the_same_answer_uncached(rest: str) -> None:
    long_rest = f"{rest}/{'x' * 600}"
    short = parse_tunnel_path(f"{PREFIX}/{rest}", None)
    long = parse_tunnel_path(f"{PREFIX}/{long_rest}", None)
    assert short is not None and long is not None
    assert long.rest.startswith(short.rest + "/")
    assert long.rest == _parse_tunnel_path(f"{PREFIX}/{long_rest}", None).rest
    parse_tunnel_path(f"{PREFIX}/{long_rest}", None)
    assert (f"{PREFIX}/{long_rest}", None) not in _parsed  # never remembered


def test_repeated_paths_come_from_the_cache() -> None:
    path = f"{PREFIX}//api/v1/namespaces/default/pods"
    first = parse_tunnel_path(path, path)
    assert (path, path) in _parsed
    assert parse_tunnel_path(path, path) is first == TunnelPath("BCS-K8S-1", "/api/v1/namespaces/default/pods")


def test_routing_fills_every_upstream_field_from_the_cluster_and_its_credentials() -> None:
    """In process, no servers: what the routing layer hands the proxy, field by field."""
    from datetime import UTC, datetime

    from bcs_middleware.core import environ as env
    from bcs_middleware.core.records import ClusterRecord, CredentialRecord
    from bcs_middleware.layers.kubernetes_route import ClusterRoutingMiddleware

    class Directory:
        def find_cluster(self, cluster_id: str) -> ClusterRecord | None:
            return ClusterRecord(cluster_id, "proj", "k8s", datetime.now(UTC))

        def get_credentials(self, cluster_id: str) -> CredentialRecord | None:
            return CredentialRecord(cluster_id, ("https://10.0.0.1:6443", "https://10.0.0.2:6443"),
                                    "CA-PEM", "sa-token")

    seen: list[dict[str, object]] = []

    def app(environ: dict[str, object], start_response: object) -> list[bytes]:
        seen.append(environ)
        return []

    class Access:
        """Alice may use BCS-K8S-1 and nothing else."""

        def allows(self, user: env.User, cluster_id: str, needed: str) -> bool:
            return (user.name, cluster_id, needed) == ("alice", "BCS-K8S-1", "view")

        def require(self, user: env.User, cluster_id: str, needed: str) -> ClusterRecord:
            raise AssertionError("routing only asks allows()")

    layer = ClusterRoutingMiddleware(app, directory=Directory(), access=Access(), tls_server_name="kubernetes",
                                     verify=True)
    alice = env.User(7, "alice", False, ("dev",))
    environ = {"PATH_INFO": f"{PREFIX}/api/v1/pods", "QUERY_STRING": "watch=true", env.USER: alice}
    layer(environ, lambda status, headers: None)
    assert seen[0][env.UPSTREAM] == env.Upstream(
        base_urls=("https://10.0.0.1:6443", "https://10.0.0.2:6443"), path="/api/v1/pods",
        query="watch=true", ca_pem="CA-PEM", server_name="kubernetes", verify=True,
        bearer_token="sa-token",
        impersonate=Impersonation("alice", ("system:authenticated", "dev")),
        client_cert=None, name="cluster:BCS-K8S-1",
    )
    # Rendered as the routing layer's header tuples always were: the user, then the groups in order.
    assert impersonation_headers(seen[0][env.UPSTREAM].impersonate) == (
        ("Impersonate-User", "alice"), ("Impersonate-Group", "system:authenticated"), ("Impersonate-Group", "dev"),
    )
    assert seen[0][env.CLUSTER] == env.Cluster("BCS-K8S-1", "proj", "k8s")
