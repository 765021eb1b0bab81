"""A cluster the gateway cannot reach, used through a real ``kube-agent --tunnel``.

Real processes throughout: ``bcs-middleware serve`` (gunicorn, HTTPS; gevent, or
gthread with ``BCS_TEST_WORKER_CLASS=gthread``) whose address policy refuses the fake
apiserver's loopback address, the agent as its own process, kubectl and the official
Python client as the clients.
"""

from __future__ import annotations

import base64
import json
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.kubernetes_route.test_upgrade import Handlers
from tests.support.fake_apiserver import ApiError, FakeAPIServer
from tests.support.gateway import wait_out_admission_refresh
from tests.support.kube import kubectl, kubectl_watch
from tests.support.polling import seconds_until, wait_for, wait_until

from .conftest import CLUSTER, SA_TOKEN, Agent, Gateway

POD = {"metadata": {"name": "p", "namespace": "default"},
       "spec": {"containers": [{"name": "app", "image": "busybox"}]}}


@pytest.fixture(scope="module")
def alice(gateway: Gateway, register_token: str) -> str:
    token = gateway.user("alice-nat")
    gateway.grant("alice-nat", cluster=CLUSTER)
    return token


@pytest.fixture
def kubeconfig(gateway: Gateway, agent: Agent, alice: str, tmp_path: Path) -> Path:
    return gateway.kubeconfig(alice, tmp_path / "kubeconfig", cluster=CLUSTER)


@pytest.fixture(scope="module")
def handlers(apiserver: FakeAPIServer) -> Iterator[Handlers]:
    apiserver.create("pods", POD, "default")
    h = Handlers(apiserver)
    apiserver.on_upgrade(h)
    yield h
    apiserver.on_upgrade(None)


def test_the_credentials_came_through_the_tunnel(gateway: Gateway, agent: Agent, apiserver: FakeAPIServer) -> None:
    status = gateway.json("GET", f"/rest/clusters/{CLUSTER}/credentials")
    assert status["reported"] and status["server_addresses"] == [apiserver.url]
    cluster = gateway.json("GET", f"/rest/clusters/{CLUSTER}")
    assert cluster["agent"]["tunnel_connected"] is True
    assert cluster["agent"]["connected_since"]


def test_kubectl_get_apply_delete(gateway: Gateway, agent: Agent, apiserver: FakeAPIServer,
                                  kubeconfig: Path) -> None:
    manifest = textwrap.dedent("""\
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: behind-nat
          namespace: default
        data:
          where: edge
    """)
    applied = kubectl("apply", "-f", "-", kubeconfig=kubeconfig, input=manifest)
    assert applied.returncode == 0, applied.stderr
    got = kubectl("get", "configmap", "behind-nat", "-o", "json", kubeconfig=kubeconfig)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["data"] == {"where": "edge"}
    # Identical to the direct path: the cluster's credential and impersonation, never the user's token.
    seen = apiserver.requests.last("/api/v1/namespaces/default/configmaps/behind-nat")
    assert seen is not None
    assert seen.headers.get("Authorization") == f"Bearer {SA_TOKEN}"
    assert seen.headers.get("Impersonate-User") == "alice-nat"
    deleted = kubectl("delete", "configmap", "behind-nat", kubeconfig=kubeconfig)
    assert deleted.returncode == 0, deleted.stderr
    assert kubectl("get", "configmap", "behind-nat", kubeconfig=kubeconfig).returncode != 0


def test_requests_through_the_agent_are_audited_as_direct_ones(gateway: Gateway, agent: Agent, alice: str) -> None:
    audit_id = "through-the-agent-0001"
    status, _ = gateway.call("GET", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/configmaps",
                             token=alice, headers={"X-Request-Id": audit_id})
    assert status == 200
    path = gateway.data / "audit.jsonl"

    def both_events() -> list[dict]:
        lines = (path.read_text() if path.exists() else "").split("\n")[:-1]
        found = [e for e in (json.loads(line) for line in lines if audit_id in line) if e["auditID"] == audit_id]
        return found if len(found) >= 2 else []

    found = wait_for(both_events, 10, "the request's two audit events never appeared")
    complete = next(e for e in found if e["stage"] == "ResponseComplete")
    assert complete["verb"] == "list" and complete["responseStatus"]["code"] == 200
    assert complete["user"]["username"] == "alice-nat"
    assert complete["impersonatedUser"]["username"] == "alice-nat"
    assert complete["annotations"]["bcs-middleware/cluster"] == CLUSTER


def test_gateway_side_admission_applies_through_the_agent(
    gateway: Gateway, agent: Agent, apiserver: FakeAPIServer, kubeconfig: Path, tmp_path: Path,
) -> None:
    """A Kubernetes webhook on the gateway admits what kubectl applies to the cluster behind NAT."""
    import sidecar_injector
    from webhook_kit import https_server

    ca = trustme.CA()
    ca.issue_cert("127.0.0.2").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "hook.pem"))
    server = https_server(sidecar_injector.app, str(tmp_path / "hook.pem"), str(tmp_path / "hook.pem"),
                          host="127.0.0.2", port=0)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    configs = f"/rest/clusters/{CLUSTER}/admissionwebhookconfigurations"
    hook = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "sidecar"},
        "webhooks": [{
            "name": "sidecar.example.com",
            "clientConfig": {"url": f"https://127.0.0.2:{server.server_port}/",
                             "caBundle": base64.b64encode(ca.cert_pem.bytes()).decode()},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"], "timeoutSeconds": 5,
        }],
    }
    status, body = gateway.call("POST", configs, body=hook)
    assert status == 201, body
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "Pod",
                                    "metadata": {"name": "injected", "namespace": "default"},
                                    "spec": {"containers": [{"name": "app", "image": "nginx:1.25"}]}}))
    try:
        wait_out_admission_refresh()
        results = []

        def applied() -> dict | None:
            results.append(kubectl("apply", "-f", str(manifest), kubeconfig=kubeconfig))
            try:
                return apiserver.store.get("pods", "default", "injected")
            except ApiError:
                return None

        pod = wait_for(applied, 10, f"never applied: {results[-1].stderr if results else ''}", step=0.5)
        result = results[-1]
        assert [c["name"] for c in pod["spec"]["containers"]] == ["app", "sidecar"], result.stderr
    finally:
        gateway.call("DELETE", f"{configs}/MutatingWebhookConfiguration/sidecar")
        server.shutdown()
        server.server_close()


def test_kubectl_watch_receives_events(agent: Agent, apiserver: FakeAPIServer, kubeconfig: Path) -> None:
    before = apiserver.open_watches
    with kubectl_watch("get", "configmaps", "--watch", "-o", "name", kubeconfig=kubeconfig) as watch:
        assert wait_until(lambda: apiserver.open_watches > before, 20), watch.lines  # open before the event
        apiserver.create("configmaps", {"metadata": {"name": "watched-1", "namespace": "default"}}, "default")
        watch.wait_for("configmap/watched-1", timeout=15)


def test_kubectl_exec_over_websocket(agent: Agent, handlers: Handlers, kubeconfig: Path) -> None:
    handlers.mode = "echo"
    result = kubectl("-v=6", "exec", "p", "-c", "app", "--", "echo", "through", "the", "agent",
                     kubeconfig=kubeconfig)
    assert result.returncode == 0, result.stderr
    # kubectl's log says who lost output, if any is lost: it was kubectl itself once (its
    # "Unknown stream id" race, see tests/kubernetes_route/test_upgrade.py Handlers._echo).
    exec_requests = [(r.query, r.headers.get("Upgrade")) for r in handlers.apiserver.requests.matching(
        "/api/v1/namespaces/default/pods/p/exec")]
    assert result.stdout == "echo through the agent\n", (result.stderr[-3000:], exec_requests)
    seen = handlers.seen[-1].info.headers
    assert (seen.get("Upgrade") or "").lower() == "websocket"
    assert seen.get("Impersonate-User") == "alice-nat"


def test_python_client_lists_and_watches(agent: Agent, apiserver: FakeAPIServer, kubeconfig: Path) -> None:
    from kubernetes import client, config, watch

    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        core = client.CoreV1Api(api_client)
        assert "p" in [p.metadata.name for p in core.list_namespaced_pod("default").items]
        w = watch.Watch()
        seen: list[tuple[str, str]] = []
        started = time.monotonic()
        created = False
        for event in w.stream(core.list_namespaced_config_map, "default", timeout_seconds=15, _request_timeout=20):
            seen.append((event["type"], event["object"].metadata.name))
            if not created:
                apiserver.create("configmaps", {"metadata": {"name": "py-nat", "namespace": "default"}}, "default")
                created = True
            if ("ADDED", "py-nat") in seen or time.monotonic() - started > 15:
                w.stop()
        assert ("ADDED", "py-nat") in seen
    finally:
        api_client.close()


def test_metrics_count_the_agent(gateway: Gateway, agent: Agent) -> None:
    assert gateway.call("GET", f"/tunnels/clusters/{CLUSTER}/version")[0] == 200
    def metrics() -> str:
        status, body = gateway.call("GET", "/metrics")
        assert status == 200
        return body.decode()

    # bytes and streams are refreshed every couple of seconds
    wait_until(lambda: f'bcs_agent_tunnel_bytes_total{{cluster="{CLUSTER}",direction="in"}}' in metrics(), 10,
               step=0.5)
    text = metrics()
    assert "bcs_agent_tunnels_connected 1.0" in text
    assert f'bcs_agent_tunnel_connections_total{{cluster="{CLUSTER}"}}' in text
    assert f'bcs_agent_tunnel_bytes_total{{cluster="{CLUSTER}",direction="in"}}' in text
    assert f'bcs_agent_tunnel_bytes_total{{cluster="{CLUSTER}",direction="out"}}' in text
    assert f'bcs_agent_tunnel_streams{{cluster="{CLUSTER}"}}' in text
    assert 'bcs_api_request_count_total{cluster="",code="101",kind="agent",method="GET"}' in text


def test_a_second_agent_for_the_cluster_takes_over_without_failing_requests(
    gateway: Gateway, agent: Agent, apiserver: FakeAPIServer, tmp_path: Path,
) -> None:
    """The newest connection wins; the older one is closed once idle (README: run one replica)."""
    second = Agent(gateway, apiserver, CLUSTER, agent.register_token, tmp_path).start()
    try:
        before = gateway.json("GET", f"/rest/clusters/{CLUSTER}")["agent"]["connected_since"]
        assert wait_until(lambda: gateway.json("GET", f"/rest/clusters/{CLUSTER}")["agent"]["connected_since"]
                          != before, 20), second.output()
        statuses = []
        for _ in range(30):  # paced: requests spread over the seconds the older connection drains
            statuses.append(gateway.call("GET", f"/tunnels/clusters/{CLUSTER}/version")[0])
            time.sleep(0.1)
        assert set(statuses) == {200}, statuses
    finally:
        second.stop()
    agent.wait_connected()


def test_a_replaced_agent_connection_drains_while_requests_keep_flowing(
    gateway: Gateway, agent: Agent, apiserver: FakeAPIServer, tmp_path: Path,
) -> None:
    """Keep-alive connections pooled over the older agent connection are not reused once a newer
    one took the cluster over: the older one empties and is closed although traffic never stops."""
    for _ in range(10):  # keep-alive connections over the first agent's connection, pooled
        assert gateway.call("GET", f"/tunnels/clusters/{CLUSTER}/version")[0] == 200
    replaced_before = agent.output().count("replaced this one")  # the module's agent: earlier tests too
    second = Agent(gateway, apiserver, CLUSTER, agent.register_token, tmp_path).start()
    try:
        statuses = []

        def replaced() -> bool:  # traffic never stops while the older connection drains
            statuses.append(gateway.call("GET", f"/tunnels/clusters/{CLUSTER}/version")[0])
            return agent.output().count("replaced this one") > replaced_before

        assert wait_until(replaced, 15, step=0.05), agent.output()
        assert set(statuses) == {200}, statuses
    finally:
        second.stop()
    agent.wait_connected()


def test_agent_killed_means_503_within_a_second_and_a_new_agent_serves_again(
    gateway: Gateway, agent: Agent, apiserver: FakeAPIServer, kubeconfig: Path, tmp_path: Path,
) -> None:
    with kubectl_watch("get", "configmaps", "--watch", "-o", "name", kubeconfig=kubeconfig) as watch:
        apiserver.create("configmaps", {"metadata": {"name": "before-kill", "namespace": "default"}}, "default")
        watch.wait_for("configmap/before-kill", timeout=15)
        agent.kill()
        answers: list[tuple[int, bytes]] = []

        def unavailable() -> bool:
            answers.append(gateway.call("GET", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces", timeout=5))
            return answers[-1][0] == 503

        took = seconds_until(unavailable, 5, "the cluster never answered 503", step=0.05)
        answer = answers[-1]
        assert answer[0] == 503, answer
        assert took < 1.0, took
        status = json.loads(answer[1])
        assert status["kind"] == "Status" and status["code"] == 503
        assert "kube-agent" in status["message"] and CLUSTER in status["message"]
        # The watch over the dead agent ends instead of hanging.
        assert wait_until(lambda: watch.proc.poll() is not None, 10), "the watch over the dead agent is still open"
    assert gateway.json("GET", f"/rest/clusters/{CLUSTER}")["agent"]["tunnel_connected"] is False

    again = Agent(gateway, apiserver, CLUSTER, agent.register_token, tmp_path).start()
    try:
        again.wait_connected()
        result = kubectl("get", "configmaps", "-o", "name", kubeconfig=kubeconfig)
        assert result.returncode == 0, result.stderr
        assert "configmap/before-kill" in result.stdout
        _, body = gateway.call("GET", "/metrics")
        assert f'bcs_agent_tunnel_reconnects_total{{cluster="{CLUSTER}"}}' in body.decode()
    finally:
        again.stop()
