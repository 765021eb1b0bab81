"""Admission definitions through the gateway's Mesos path, with the caller's authorization.

bk-bcs managed a Mesos cluster's admission webhook definitions through the scheduler API,
``/bcsapi/v4/scheduler/mesos/namespaces/{ns}/admissionwebhook[/{name}]`` and ``…/admissionwebhooks``
with ``BCS-ClusterID``. Here the gateway serves them itself (superusers, or ``edit`` on that
cluster), stores them under the cluster's id, and the cluster's driver — given the gateway's
database (``--database-url``) — admits with them. Real processes: a gateway and a driver
(``bcs-middleware serve``) sharing one SQLite database, a real ZooKeeper, a fake scheduler.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import trustme

from bcs_middleware.admission.definitions import parse_bcs_definition
from bcs_middleware.core.errors import Conflict
from bcs_middleware.store.definitions import SQLDefinitionStore
from bcs_middleware.store.sql import open_store
from tests.support.polling import wait_until
from tests.support.servers import BIN, ServerProcess, free_port

CLI = str(BIN / "bcs-middleware")
ADMIN = "definitions-admin-token-" + "d" * 20
CLUSTER = "BCS-MESOS-DEFS"
PREFIX = "/bcsapi/v4/scheduler/mesos/"


def _definition(name: str, url: str) -> dict:
    bundle = base64.b64encode(trustme.CA().cert_pem.bytes()).decode()
    return {"apiVersion": "v4", "kind": "admissionwebhook", "metadata": {"name": name, "namespace": "prod"},
            "resourcesRef": {"operation": "Create", "kind": "Application"},
            "admissionWebhooks": [{"name": "guard", "failurePolicy": "Fail",
                                   "clientConfig": {"caBundle": bundle, "url": url}}]}


class _Client:
    def __init__(self, port: int, cafile: str) -> None:
        self.base = f"https://localhost:{port}"
        self.ctx = ssl.create_default_context(cafile=cafile)

    def call(self, method: str, path: str, token: str | None, *, body: dict | None = None,
             cluster: str | None = CLUSTER) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if cluster:
            headers["BCS-ClusterID"] = cluster
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.ctx) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")


def test_definitions_through_the_gateway_path_with_the_callers_authorization(
        zookeeper, fakes, registrars, tmp_path: Path) -> None:
    root = "/compat-defs"
    scheduler = fakes("scheduler")
    registrars(zookeeper.hosts, f"{root}/scheduler", scheduler)
    gw_data, driver_data = tmp_path / "gw", tmp_path / "driver"
    gw_port, driver_port = free_port(), free_port()
    # the driver first: the gateway is given the CA the driver generates when it starts
    driver = ServerProcess(
        [CLI, "serve", "--role", "driver", "--cluster-id", CLUSTER, "--zookeeper", zookeeper.hosts,
         "--zookeeper-root", root, "--data-dir", str(driver_data), "--bind", f"127.0.0.1:{driver_port}",
         "--workers", "1", "--threads", "4", "--graceful-timeout", "3",
         "--database-url", f"sqlite:///{gw_data / 'bcs.sqlite3'}"],
        port=driver_port, scheme="https", timeout=60)
    gateway = None
    try:
        gateway = ServerProcess(
            [CLI, "serve", "--zookeeper", zookeeper.hosts, "--zookeeper-root", root, "--data-dir", str(gw_data),
             "--bind", f"127.0.0.1:{gw_port}", "--workers", "1", "--threads", "8", "--graceful-timeout", "3",
             "--driver-ca-file", str(driver_data / "tls" / "ca.crt")],
            port=gw_port, env={"BCS_ADMIN_TOKEN": ADMIN}, scheme="https", timeout=60)
        api = _Client(gw_port, str(gw_data / "tls" / "ca.crt"))

        def user(name: str) -> str:
            status, made = api.call("POST", "/rest/users/", ADMIN, body={"user_name": name}, cluster=None)
            assert status == 201, made
            return str(api.call("POST", f"/rest/users/{made['id']}/tokens", ADMIN, cluster=None)[1]["user_token"])

        status, _ = api.call("POST", "/rest/clusters/bcs", ADMIN, cluster=None,
                             body={"id": CLUSTER, "project_id": "p", "cluster_type": "mesos"})
        assert status == 201
        editor, viewer, stranger = user("ed"), user("vi"), user("st")
        for name, permission in (("ed", "edit"), ("vi", "view")):
            assert api.call("PUT", f"/rest/clusters/{CLUSTER}/permissions/{name}", ADMIN, cluster=None,
                            body={"permission": permission})[0] == 201

        refused = _definition("guard", f"https://127.0.0.1:{free_port()}/")  # nothing listens: Fail
        create = PREFIX + "namespaces/prod/admissionwebhook"
        # who may not: the bcs envelope, with real statuses
        for token, status in ((None, 401), (stranger, 404), (viewer, 403)):
            got, body = api.call("POST", create, token, body=refused)
            assert got == status, body
            assert body["result"] is False and body["data"] is None and isinstance(body["code"], int)
        got, body = api.call("POST", create, editor, body=refused)
        assert got == 201, body
        assert body["metadata"]["name"] == "guard"
        status, listed = api.call("GET", PREFIX + "admissionwebhooks", editor)
        assert status == 200 and [d["metadata"]["name"] for d in listed["items"]] == ["guard"]
        assert api.call("GET", PREFIX + "namespaces/prod/admissionwebhook/guard", viewer)[0] == 403
        # a Kubernetes cluster's id is no Mesos cluster, whoever asks
        assert api.call("POST", "/rest/clusters/bcs", ADMIN, cluster=None,
                        body={"id": "BCS-K8S-DEFS", "project_id": "p", "cluster_type": "k8s"})[0] == 201
        assert api.call("POST", create, ADMIN, body=refused, cluster="BCS-K8S-DEFS")[0] == 404
        # scoped to that cluster: the gateway-wide list (superusers, /rest/) does not hold it
        assert api.call("GET", "/rest/admissionwebhooks", ADMIN, cluster=None)[1]["items"] == []

        # the driver admits with it: an application create fails the webhook → the driver's 400, 1405234
        # the source's own example application (the driver converts it for the scheduler's /v1/apps)
        app = json.loads((Path(__file__).parent / "fixtures" / "application.json").read_text())
        app["metadata"].update(name="web", namespace="prod")
        answers: list[tuple[int, dict]] = []

        def webhook_refuses() -> bool:  # once the driver has registered and refreshed its definitions
            answers.append(api.call("POST", PREFIX + "namespaces/prod/applications", editor, body=app))
            return answers[-1][0] == 400

        wait_until(webhook_refuses, 20, step=0.3)
        status, body = answers[-1]
        assert (status, body["result"], body["code"], body["data"]) == (400, False, 1405234, None), body
        assert "guard" in body["message"]
        assert not [r for r in scheduler.requests if "/apps" in r.path or r.path.endswith("/applications")]

        # removed through the same path: the application goes through to the scheduler again
        assert api.call("DELETE", PREFIX + "namespaces/prod/admissionwebhook/guard", editor)[0] == 200
        assert wait_until(lambda: api.call("POST", PREFIX + "namespaces/prod/applications", editor,
                                           body=app)[0] == 200, 15, 0.3)
    finally:
        if gateway is not None:
            gateway.stop()
        driver.stop()



def test_a_clusters_editors_add_admission_but_never_replace_the_gateway_wide_one(tmp_path: Path) -> None:
    store = open_store(None, data_dir=tmp_path)
    try:
        wide = SQLDefinitionStore(store, refresh=0)
        cluster = SQLDefinitionStore(store, refresh=0, bcs_cluster=CLUSTER)
        driver_view = SQLDefinitionStore(store, refresh=0, bcs_cluster=CLUSTER, inherit=True)
        other_driver = SQLDefinitionStore(store, refresh=0, bcs_cluster="BCS-MESOS-OTHER", inherit=True)
        cluster.put_bcs(parse_bcs_definition(_definition("mine", "https://127.0.0.1:1/")))
        assert [d.name for d in driver_view.list_bcs()] == ["mine"]
        assert other_driver.list_bcs() == [] and wide.list_bcs() == []  # scoped to its cluster
        wide.put_bcs(parse_bcs_definition(_definition("policy", "https://127.0.0.1:2/")))
        # the superuser's definition wins for (Create, application) on every cluster
        assert [d.name for d in driver_view.list_bcs()] == ["policy"]
        assert [d.name for d in other_driver.list_bcs()] == ["policy"]
        with pytest.raises(Conflict):
            cluster.put_bcs(parse_bcs_definition(_definition("mine2", "https://127.0.0.1:3/")))
    finally:
        store.db.dispose()
