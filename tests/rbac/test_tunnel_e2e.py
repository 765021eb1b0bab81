"""End to end: a user granted ``view`` reaches the cluster through a real gateway tunnel.

The gateway is the real ``bcs-middleware serve`` (gunicorn, HTTPS) of the tunnel tests;
the fake apiserver enforces RBAC from its own stored bindings (``rbac_authorizer``), so
what the user may do is exactly what the reconciler's bindings say — for the name the
gateway impersonates.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bcs_middleware.rbac.service import RBACService
from bcs_middleware.rbac.sources import FileSource
from bcs_middleware.store.sql import SQLStore, open_store
from tests.kubernetes_route.conftest import CLUSTER, Gateway

# The tunnel tests' module-scoped fixtures: a real gateway and its fake cluster.
from tests.kubernetes_route.conftest import apiserver as apiserver
from tests.kubernetes_route.conftest import gateway as gateway
from tests.support.fake_apiserver import FakeAPIServer, rbac_authorizer
from tests.support.kube import kubectl, kubectl_path

PODS = f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods"


@pytest.fixture
def gateway_store(gateway: Gateway) -> Iterator[SQLStore]:
    """The gateway's own database, opened from this process like a second gateway would."""
    store = open_store(data_dir=gateway.data)
    yield store
    store.db.dispose()


def test_user_granted_view_reaches_the_cluster_with_the_bound_name(
    gateway: Gateway, apiserver: FakeAPIServer, gateway_store: SQLStore, tmp_path: Path,
) -> None:
    apiserver.authorize(rbac_authorizer(apiserver))
    apiserver.create("pods", {"metadata": {"name": "web", "namespace": "default"},
                              "spec": {"containers": [{"name": "c", "image": "nginx"}]}})
    token = gateway.user("viewer")
    gateway.grant("viewer")  # the gateway lets them use the cluster; the cluster's RBAC decides what for
    try:
        status, _ = gateway.call("GET", PODS, token=token)
        assert status == 403  # no binding yet: the cluster's RBAC says no

        grants = tmp_path / "rbac.json"
        grants.write_text(json.dumps({"version": 1, "grants": [
            {"user": "viewer", "cluster": CLUSTER, "namespace": "default", "role": "view"}]}))
        service = RBACService(gateway_store, FileSource(grants), tick=0.2, lease_ttl=5.0, connect_timeout=2.0)
        try:
            assert service.tick() == [CLUSTER]
            assert service.wait_idle(15)
        finally:
            service.stop()
        binding = apiserver.store.get("rolebindings", "default", "bcs:viewer:view")

        apiserver.requests.clear()
        status, body = gateway.call("GET", PODS, token=token)
        assert status == 200, body
        assert [p["metadata"]["name"] for p in json.loads(body)["items"]] == ["web"]
        seen = apiserver.requests.last(PODS.split(CLUSTER)[1], "GET")
        assert seen is not None
        # The name the gateway impersonates is the subject the reconciler bound.
        assert seen.headers["Impersonate-User"] == binding["subjects"][0]["name"] == "viewer"
        assert "system:authenticated" in seen.headers.getlist("Impersonate-Group")

        status, body = gateway.call("POST", PODS, token=token, body={
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "evil", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "nginx"}]}})
        assert status == 403 and json.loads(body)["kind"] == "Status"
        status, _ = gateway.call("GET", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/kube-system/pods",
                                 token=token)
        assert status == 403  # the grant is for "default" only

        if kubectl_path() is not None:
            kubeconfig = gateway.kubeconfig(token, tmp_path / "viewer.kubeconfig")
            allowed = kubectl("get", "pods", "-n", "default", "-o", "name", kubeconfig=kubeconfig)
            assert allowed.returncode == 0 and "pod/web" in allowed.stdout, allowed.stderr
            refused = kubectl("delete", "pod", "web", "-n", "default", kubeconfig=kubeconfig)
            assert refused.returncode != 0 and "forbidden" in refused.stderr.lower()
    finally:
        apiserver.authorize(None)
