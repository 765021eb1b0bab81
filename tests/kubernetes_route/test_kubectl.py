"""kubectl and the official Python client through the gateway's tunnel, as users run them."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.kube import kubectl, kubectl_versions, kubectl_watch
from tests.support.polling import wait_until

from .conftest import ADMIN, CLUSTER, SA_TOKEN, Gateway

VERSIONS = [v for v in ("1.27", None, "1.33") if v is None or v in kubectl_versions()]


@pytest.fixture(scope="module")
def alice(gateway: Gateway) -> str:
    token = gateway.user("alice")
    gateway.grant("alice")  # view: use the cluster (its RBAC decides the rest)
    return token


@pytest.fixture
def alice_kubeconfig(gateway: Gateway, alice: str, tmp_path: Path) -> Path:
    return gateway.kubeconfig(alice, tmp_path / "kubeconfig")


def test_kube_agent_registered_the_cluster(gateway: Gateway, apiserver: FakeAPIServer) -> None:
    status, body = gateway.call("GET", f"/rest/clusters/{CLUSTER}/client_credentials")
    assert status == 200
    creds = json.loads(body)
    assert creds["server_address"] == f"{gateway.url}/tunnels/clusters/{CLUSTER}/"
    # The seed's own curl example: {server_address}/version (a doubled slash) works too.
    status, version = gateway.call("GET", f"/tunnels/clusters/{CLUSTER}//version")
    assert status == 200 and json.loads(version)["major"] == "1"


@pytest.mark.parametrize("version", VERSIONS, ids=[v or "default" for v in VERSIONS])
def test_kubectl_round_trip(gateway: Gateway, apiserver: FakeAPIServer, alice_kubeconfig: Path,
                            tmp_path: Path, version: str | None) -> None:
    name = f"web-{(version or 'default').replace('.', '-')}"
    result = kubectl("version", "-o", "json", kubeconfig=alice_kubeconfig, version=version)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["serverVersion"]["major"] == "1"

    manifest = tmp_path / "pod.yaml"
    manifest.write_text(textwrap.dedent(f"""
        apiVersion: v1
        kind: Pod
        metadata:
          name: {name}
          namespace: default
          labels: {{app: web}}
        spec:
          containers:
            - name: nginx
              image: nginx:1.25
    """))
    applied = kubectl("apply", "-f", str(manifest), kubeconfig=alice_kubeconfig, version=version)
    assert applied.returncode == 0, applied.stderr
    assert f"pod/{name} created" in applied.stdout

    listed = kubectl("get", "pods", "-n", "default", kubeconfig=alice_kubeconfig, version=version)
    assert listed.returncode == 0, listed.stderr
    assert name in listed.stdout

    manifest.write_text(manifest.read_text().replace("nginx:1.25", "nginx:1.27"))
    again = kubectl("apply", "-f", str(manifest), kubeconfig=alice_kubeconfig, version=version)
    assert again.returncode == 0 and f"pod/{name} configured" in again.stdout, again.stderr
    assert apiserver.store.get("pods", "default", name)["spec"]["containers"][0]["image"] == "nginx:1.27"

    deleted = kubectl("delete", "pod", name, "-n", "default", "--wait=false", kubeconfig=alice_kubeconfig,
                      version=version)
    assert deleted.returncode == 0, deleted.stderr
    assert f'pod "{name}" deleted' in deleted.stdout


def test_kubectl_watch_receives_events_as_they_happen(gateway: Gateway, apiserver: FakeAPIServer,
                                                      alice_kubeconfig: Path) -> None:
    before = apiserver.open_watches
    with kubectl_watch("get", "pods", "-n", "default", "--watch", "--output-watch-events",
                       kubeconfig=alice_kubeconfig) as watch:
        # The watch is open before the event, so it arrives over the stream.
        assert wait_until(lambda: apiserver.open_watches > before, 20), watch.lines
        apiserver.store.create("pods", {"metadata": {"name": "watched-1", "namespace": "default"},
                                        "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
        line = watch.wait_for("watched-1", timeout=20)
        assert "ADDED" in line
        apiserver.store.delete("pods", "default", "watched-1")
        assert "DELETED" in watch.wait_for("watched-1", timeout=20)


def test_unknown_cluster_is_a_readable_kubectl_error(gateway: Gateway, alice: str, tmp_path: Path) -> None:
    kubeconfig = gateway.kubeconfig(alice, tmp_path / "kc")
    kubeconfig.write_text(kubeconfig.read_text().replace(f"/tunnels/clusters/{CLUSTER}/", "/tunnels/clusters/nope/"))
    result = kubectl("get", "pods", kubeconfig=kubeconfig)
    assert result.returncode != 0
    # kubectl's discovery replaces any 404 body by its own generic sentence ...
    assert "Error from server (NotFound)" in result.stderr
    # ... while the gateway answers a Status that names the cluster, for clients that show it.
    status, body = gateway.call("GET", "/tunnels/clusters/nope/api", token=alice)
    document = json.loads(body)
    assert status == 404 and document["kind"] == "Status" and document["reason"] == "NotFound"
    assert document["message"] == "cluster 'nope' not found"


def test_bad_token_is_a_readable_kubectl_error(gateway: Gateway, alice: str, tmp_path: Path) -> None:
    kubeconfig = gateway.kubeconfig(alice, tmp_path / "kc")
    kubeconfig.write_text(kubeconfig.read_text().replace(alice, "x" * 43))
    result = kubectl("get", "pods", kubeconfig=kubeconfig)
    assert result.returncode != 0
    assert "Unauthorized" in result.stderr or "must be logged in" in result.stderr


def test_client_impersonation_is_refused(gateway: Gateway, apiserver: FakeAPIServer, alice_kubeconfig: Path) -> None:
    apiserver.requests.clear()
    result = kubectl("get", "pods", "--as", "admin", "--as-group", "system:masters", kubeconfig=alice_kubeconfig)
    assert result.returncode != 0 and "Forbidden" in result.stderr
    # kubectl's discovery prints "Forbidden: unknown" for any JSON 403 (as with a real apiserver);
    # the Status itself names the refused header.
    for header in ("Impersonate-User", "impersonate-group", "Impersonate-Extra-Scopes", "Impersonate-Uid"):
        status, body = gateway.call("GET", f"/tunnels/clusters/{CLUSTER}/api", headers={header: "x"})
        document = json.loads(body)
        assert status == 403 and document["kind"] == "Status" and document["reason"] == "Forbidden"
        assert "header is not allowed through the gateway" in document["message"]
    assert not apiserver.requests.snapshot()


def test_impersonation_and_credentials_upstream(gateway: Gateway, apiserver: FakeAPIServer, alice: str) -> None:
    apiserver.requests.clear()
    assert gateway.call("GET", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces?limit=5", token=alice)[0] == 200
    seen = apiserver.requests.last("/api/v1/namespaces")
    assert seen is not None and seen.query == "limit=5"
    assert seen.headers["authorization"] == f"Bearer {SA_TOKEN}"
    assert seen.headers["impersonate-user"] == "alice"
    assert seen.headers.getlist("impersonate-group") == ["system:authenticated"]
    # A superuser acts with the credential's own rights: no impersonation.
    apiserver.requests.clear()
    assert gateway.call("GET", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces", token=ADMIN)[0] == 200
    seen = apiserver.requests.last("/api/v1/namespaces")
    assert seen is not None and "impersonate-user" not in seen.headers
    assert seen.headers["authorization"] == f"Bearer {SA_TOKEN}"


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/tunnels/clusters/BCS-K8S-T01/api/../../rest/users/admin", id="dotdot"),
        pytest.param("/tunnels/clusters/BCS-K8S-T01/api%2F..%2F..%2Fversion", id="encoded-slash"),
        pytest.param("/tunnels/clusters/BCS-K8S-T01/./version", id="dot"),
    ],
)
def test_paths_leaving_the_cluster_prefix_are_refused(gateway: Gateway, path: str) -> None:
    import http.client
    import ssl

    # urllib would normalise the path; send it raw.
    conn = http.client.HTTPSConnection("localhost", gateway.server.port,
                                       context=ssl.create_default_context(cafile=gateway.ca_file), timeout=10)
    conn.request("GET", path, headers={"Authorization": f"Bearer {ADMIN}"})
    resp = conn.getresponse()
    body = json.loads(resp.read())
    conn.close()
    assert resp.status == 400
    assert body["kind"] == "Status" and body["code"] == 400


def test_python_client_lists_and_watches(gateway: Gateway, apiserver: FakeAPIServer, alice_kubeconfig: Path) -> None:
    from kubernetes import client, config, watch

    api_client = config.new_client_from_config(config_file=str(alice_kubeconfig))
    core = client.CoreV1Api(api_client)
    apiserver.store.create("pods", {"metadata": {"name": "py-1", "namespace": "default"},
                                    "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    names = [p.metadata.name for p in core.list_namespaced_pod("default").items]
    assert "py-1" in names
    w = watch.Watch()
    seen: list[tuple[str, str]] = []
    started = time.monotonic()
    created = False
    for event in w.stream(core.list_namespaced_pod, "default", timeout_seconds=15, _request_timeout=20):
        seen.append((event["type"], event["object"].metadata.name))
        if not created:
            apiserver.store.create("pods", {"metadata": {"name": "py-2", "namespace": "default"},
                                            "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
            created = True
        if ("ADDED", "py-2") in seen or time.monotonic() - started > 15:
            w.stop()
    assert ("ADDED", "py-2") in seen
    api_client.close()
