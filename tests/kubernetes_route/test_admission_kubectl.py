"""Gateway-side admission on tunnel traffic: kubectl apply gets a sidecar it never asked for."""

from __future__ import annotations

import base64
import json
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sidecar_injector
import trustme
from webhook_kit import https_server

from tests.support.fake_apiserver import ApiError, FakeAPIServer
from tests.support.gateway import wait_out_admission_refresh
from tests.support.kube import kubectl
from tests.support.polling import wait_until
from tests.support.servers import free_port

from .conftest import CLUSTER, Gateway

CONFIGS = f"/rest/clusters/{CLUSTER}/admissionwebhookconfigurations"


@pytest.fixture
def injector(tmp_path: Path) -> Iterator[tuple[int, str]]:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "hook.pem"))
    server = https_server(sidecar_injector.app, str(tmp_path / "hook.pem"), str(tmp_path / "hook.pem"), port=0)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server.server_port, base64.b64encode(ca.cert_pem.bytes()).decode()
    server.shutdown()
    server.server_close()


def _configuration(name: str, url: str, ca_bundle: str, policy: str = "Fail") -> dict:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": f"{name}.example.com",
            "clientConfig": {"url": url, "caBundle": ca_bundle},
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods"]}],
            "failurePolicy": policy,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 2,
        }],
    }


def _pod(tmp_path: Path, name: str) -> Path:
    manifest = tmp_path / f"{name}.yaml"
    manifest.write_text(textwrap.dedent(f"""
        apiVersion: v1
        kind: Pod
        metadata: {{name: {name}, namespace: default}}
        spec:
          containers: [{{name: app, image: nginx:1.25}}]
    """))
    return manifest


def _apply_until(kubeconfig: Path, manifest: Path, expect: str, deadline_s: float = 10) -> str:
    """``kubectl apply`` until its output says ``expect`` (or ``deadline_s`` passed); the output."""
    outputs: list[str] = []

    def applied() -> bool:
        result = kubectl("apply", "-f", str(manifest), kubeconfig=kubeconfig)
        outputs.append(result.stdout + result.stderr)
        return expect in outputs[-1]

    wait_until(applied, deadline_s, step=0.5)
    return outputs[-1]


def test_kubectl_apply_gets_a_sidecar_from_a_kubernetes_webhook(
    gateway: Gateway, apiserver: FakeAPIServer, injector: tuple[int, str], tmp_path: Path
) -> None:
    port, ca_bundle = injector
    alice = gateway.user("alice-admission")
    gateway.grant("alice-admission")
    kubeconfig = gateway.kubeconfig(alice, tmp_path / "kc")
    status, body = gateway.call("POST", CONFIGS, body=_configuration("sidecar", f"https://localhost:{port}/",
                                                                       ca_bundle))
    assert status == 201, body
    try:
        wait_out_admission_refresh()  # so both workers have it
        output = _apply_until(kubeconfig, _pod(tmp_path, "injected"), "created")
        assert "pod/injected created" in output, output
        pod = apiserver.store.get("pods", "default", "injected")
        assert [c["name"] for c in pod["spec"]["containers"]] == ["app", "sidecar"]
        assert pod["metadata"]["annotations"]["sidecar-injector/status"] == "injected"
    finally:
        gateway.call("DELETE", f"{CONFIGS}/MutatingWebhookConfiguration/sidecar")


def test_failing_webhook_with_fail_policy_blocks_and_names_itself(
    gateway: Gateway, apiserver: FakeAPIServer, injector: tuple[int, str], tmp_path: Path
) -> None:
    _, ca_bundle = injector
    alice = gateway.user("alice-admission-2")
    gateway.grant("alice-admission-2")
    kubeconfig = gateway.kubeconfig(alice, tmp_path / "kc")
    dead = f"https://localhost:{free_port()}/"
    status, body = gateway.call("POST", CONFIGS, body=_configuration("broken", dead, ca_bundle))
    assert status == 201, body
    try:
        wait_out_admission_refresh()
        output = _apply_until(kubeconfig, _pod(tmp_path, "blocked"), "broken.example.com")
        assert 'failed calling webhook "broken.example.com"' in output, output
        with pytest.raises(ApiError) as missing:
            apiserver.store.get("pods", "default", "blocked")
        assert missing.value.code == 404
    finally:
        gateway.call("DELETE", f"{CONFIGS}/MutatingWebhookConfiguration/broken")


def test_configuration_changes_are_refused_for_ordinary_users(gateway: Gateway, injector: tuple[int, str]) -> None:
    _, ca_bundle = injector
    alice = gateway.user("alice-admission-3")
    status, body = gateway.call("POST", CONFIGS, token=alice,
                                body=_configuration("x", "https://localhost:1/", ca_bundle))
    assert status == 404, body  # without view the cluster does not exist for her
    gateway.grant("alice-admission-3")  # view: she may use the cluster, not manage it
    status, body = gateway.call("POST", CONFIGS, token=alice,
                                body=_configuration("x", "https://localhost:1/", ca_bundle))
    assert status == 403, body
    assert json.loads(body)["code_name"]


def test_namespace_selector_and_updates_read_the_cluster_with_its_credentials(
    gateway: Gateway, apiserver: FakeAPIServer, injector: tuple[int, str], tmp_path: Path
) -> None:
    """Namespace labels and old objects are read from the cluster through the reported credentials."""
    port, ca_bundle = injector
    apiserver.store.create("namespaces", {"metadata": {"name": "inject-me", "labels": {"sidecar": "on"}}})
    alice = gateway.user("alice-admission-4")
    gateway.grant("alice-admission-4")
    kubeconfig = gateway.kubeconfig(alice, tmp_path / "kc")
    config = _configuration("selective", f"https://localhost:{port}/", ca_bundle)
    config["webhooks"][0]["namespaceSelector"] = {"matchLabels": {"sidecar": "on"}}
    status, body = gateway.call("POST", CONFIGS, body=config)
    assert status == 201, body
    try:
        wait_out_admission_refresh()
        plain = _pod(tmp_path, "plain")
        labelled = tmp_path / "labelled.yaml"
        labelled.write_text(_pod(tmp_path, "labelled").read_text().replace("namespace: default",
                                                                            "namespace: inject-me"))
        assert "created" in _apply_until(kubeconfig, plain, "created")
        assert "created" in _apply_until(kubeconfig, labelled, "created")
        assert [c["name"] for c in apiserver.store.get("pods", "default", "plain")["spec"]["containers"]] == ["app"]
        injected = apiserver.store.get("pods", "inject-me", "labelled")
        assert [c["name"] for c in injected["spec"]["containers"]] == ["app", "sidecar"]
        # An update (PUT) is admitted with the old object read from the cluster.
        current = apiserver.store.get("pods", "default", "plain")
        current["metadata"].setdefault("labels", {})["touched"] = "yes"
        replaced = tmp_path / "replace.json"
        replaced.write_text(json.dumps(current))
        result = kubectl("replace", "-f", str(replaced), kubeconfig=kubeconfig)
        assert result.returncode == 0, result.stderr
        assert apiserver.store.get("pods", "default", "plain")["metadata"]["labels"]["touched"] == "yes"
    finally:
        gateway.call("DELETE", f"{CONFIGS}/MutatingWebhookConfiguration/selective")
