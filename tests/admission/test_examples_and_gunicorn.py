"""The example injectors (both protocols) and the layer in a real gunicorn in front of a foreign app."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lxcfs_injector
import pytest
import requests
import sidecar_injector
import trustme
from webhook_kit import https_server
from werkzeug.test import Client

from bcs_middleware.admission.definitions import parse_bcs_definition, parse_k8s_configuration
from bcs_middleware.admission.store import MemoryDefinitionStore
from bcs_middleware.core.environ import CLUSTER, Cluster
from bcs_middleware.core.errors import ConfigError
from bcs_middleware.layers.admission import AdmissionMiddleware, filter_factory
from tests.support.servers import gunicorn

from .apps import echo_app
from .conftest import bcs_definition, bcs_webhook, client_for, k8s_configuration, k8s_webhook


class Served:
    def __init__(self, app: Any, cert: trustme.LeafCert, tmp: Path) -> None:
        cert.cert_chain_pems[0].write_to_path(str(tmp / "cert.pem"))
        for blob in cert.cert_chain_pems[1:]:
            blob.write_to_path(str(tmp / "cert.pem"), append=True)
        cert.private_key_pem.write_to_path(str(tmp / "key.pem"))
        self.server = https_server(app, str(tmp / "cert.pem"), str(tmp / "key.pem"), port=0)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
def injectors(server_cert: trustme.LeafCert, tmp_path: Path) -> Iterator[tuple[Served, Served]]:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    sidecar = Served(sidecar_injector.app, server_cert, tmp_path / "a")
    lxcfs = Served(lxcfs_injector.app, server_cert, tmp_path / "b")
    yield sidecar, lxcfs
    for served in (sidecar, lxcfs):
        served.server.shutdown()
        served.server.server_close()


DEPLOYMENT = {
    "apiVersion": "v4", "kind": "deployment",
    "metadata": {"name": "web", "namespace": "prod"},
    "spec": {"template": {"metadata": {"annotations": {"sidecar-injector.lxcfs/inject": "true"}},
                          "spec": {"containers": [{"name": "app", "image": "nginx"}]}}},
}


def _check_injected(obj: dict[str, Any]) -> None:
    spec = obj["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["app", "sidecar"]
    assert obj["spec"]["template"]["metadata"]["annotations"]["sidecar-injector.lxcfs/status"] == "injected"
    app, sidecar = spec["containers"]
    if obj["apiVersion"] == "v4":
        # bcs v4 shapes (bcs-common Container, VolumeUnit): what the Mesos driver reads
        assert sidecar["command"] == "sh" and sidecar["args"] == ["-c", "tail -F /var/log/app/*.log"]
        assert sidecar["resources"] == {"limits": {"cpu": "0.1", "memory": "64"}} and sidecar["type"] == "MESOS"
        mounts = {v["volume"]["mountPath"]: v["volume"] for v in app["volumes"]}
        assert mounts["/proc/meminfo"] == {"hostPath": "/var/lib/lxcfs/proc/meminfo", "mountPath": "/proc/meminfo",
                                           "readOnly": True}
        assert "volumeMounts" not in app and "volumes" not in spec
    else:
        assert sidecar["command"] == ["sh", "-c", "tail -F /var/log/app/*.log"]
        assert {m["mountPath"] for m in app["volumeMounts"]} >= {"/proc/meminfo"}
        assert {v["name"] for v in spec["volumes"]} >= {"lxcfs-proc-meminfo"}


def test_example_injectors_speak_the_bcs_protocol(injectors, ca):
    sidecar, lxcfs = injectors
    store = MemoryDefinitionStore([parse_bcs_definition(bcs_definition("inject", [
        bcs_webhook("hook-a.webhooks", ca), bcs_webhook("hook-b.webhooks", ca)], kind="Deployment"))])
    layer = AdmissionMiddleware(echo_app, store=store, client=client_for(
        ("hook-a.webhooks", sidecar), ("hook-b.webhooks", lxcfs)))  # type: ignore[arg-type]
    response = Client(layer).post("/deployments", data=json.dumps(DEPLOYMENT),
                                  content_type="application/json")
    _check_injected(response.get_json()["body"])


def test_example_injectors_speak_the_kubernetes_protocol(injectors, ca):
    sidecar, lxcfs = injectors
    k8s_deployment = {**DEPLOYMENT, "apiVersion": "apps/v1", "kind": "Deployment"}
    store = MemoryDefinitionStore(k8s={"c1": [parse_k8s_configuration(k8s_configuration("inject", [
        k8s_webhook("sidecar.example.com", "hook-a.webhooks", ca, resources=("deployments",)),
        k8s_webhook("lxcfs.example.com", "hook-b.webhooks", ca, resources=("deployments",)),
    ]))]})
    layer = AdmissionMiddleware(echo_app, store=store, client=client_for(
        ("hook-a.webhooks", sidecar), ("hook-b.webhooks", lxcfs)))  # type: ignore[arg-type]
    response = Client(layer).post(
        "/tunnels/clusters/c1/apis/apps/v1/namespaces/prod/deployments",
        data=json.dumps(k8s_deployment), content_type="application/json",
        environ_overrides={CLUSTER: Cluster("c1", "p", "k8s")})
    _check_injected(response.get_json()["body"])


def test_mutated_body_reaches_a_foreign_app_through_gunicorn(injectors, ca, tmp_path):
    sidecar, lxcfs = injectors
    definitions = tmp_path / "admission.json"
    definitions.write_text(json.dumps({"admissionwebhooks": [bcs_definition("inject", [
        bcs_webhook("hook-a.webhooks", ca), bcs_webhook("hook-b.webhooks", ca)],
        kind="Deployment")]}))
    env = {"ADMISSION_DEFINITIONS": str(definitions),
           "ADMISSION_ADDRESS_MAP": json.dumps({"hook-a.webhooks": sidecar.address,
                                                "hook-b.webhooks": lxcfs.address})}
    root = Path(__file__).resolve().parents[2]
    with gunicorn("tests.admission.gunicorn_app:app", env=env, extra=["--chdir", str(root)]) as server:
        sized = requests.post(f"{server.url}/mesosdriver/v4/scheduler/namespaces/prod/deployments",
                              json=DEPLOYMENT, timeout=20)
        chunked = requests.post(f"{server.url}/mesosdriver/v4/scheduler/namespaces/prod/deployments",
                                data=iter([json.dumps(DEPLOYMENT).encode()]),
                                headers={"Content-Type": "application/json"}, timeout=20)
    for response in (sized, chunked):
        assert response.status_code == 200, response.text
        echoed = response.json()
        _check_injected(echoed["body"])
        assert int(echoed["content_length"]) == echoed["received"]
        assert echoed["transfer_encoding"] is None
    assert chunked.request.headers.get("Transfer-Encoding") == "chunked"


def test_filter_factory_rejects_unknown_keys_and_bad_definition_files(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'budget'"):
        filter_factory({}, budget="5")
    bad = tmp_path / "defs.yaml"
    bad.write_text("admissionwebhooks:\n  - apiVersion: v4\n    kind: admissionwebhook\n")
    with pytest.raises(ConfigError, match=r"admissionwebhooks\[0\]: \(body\): missing required field"):
        filter_factory({}, definitions_file=str(bad))
