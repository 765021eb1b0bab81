"""Protocol conversion through a real `serve --role driver` to a fake bcs-scheduler that checks the payloads.

Fixtures are the source's own examples: ``fixtures/application.json`` is the v4
application template of ``docs/templates/mesos-artifact/application.md`` (its
``A|B`` placeholders set to one value), ``fixtures/deployment.json`` the
createDeployment body of ``docs/apidoc/api-scheduler.md`` (TencentBlueKing/bk-bcs) — both with
``networkType`` spelled as its JSON tag ``networktype``; the source's own spellings, read as Go
reads them, are ``test_go_decoding.py``'s.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from bcs_middleware.scheduler.convert import BCS_DRIVER_PARAMETER_ERR, BCS_JSON_DECODE, BCS_REQUEST_DATA_ERR
from tests.support.fake_scheduler import FakeScheduler, Recorded
from tests.support.servers import BIN, ServerProcess, free_port

CLUSTER = "BCS-MESOS-CONVERT"
FIXTURES = Path(__file__).parent / "fixtures"
APPLICATION = json.loads((FIXTURES / "application.json").read_text())
DEPLOYMENT = json.loads((FIXTURES / "deployment.json").read_text())
PROCESS = {"apiVersion": "v4", "kind": "process", "metadata": {"name": "gamesvr", "namespace": "nfsol"},
           "spec": {"instance": 1, "template": {"spec": {"processes": [{
               "procName": "gamesvr", "workPath": "/data/gamesvr", "startCmd": "./start.sh",
               "resources": {"limits": {"cpu": "1", "memory": "512"}}}]}}}}
CONFIGMAP = {"apiVersion": "v4", "kind": "configmap", "metadata": {"name": "cm", "namespace": "nfsol"},
             "datas": {"item-one": {"type": "file", "content": "aGVsbG8="}}}


class Driver:
    def __init__(self, base: str, cafile: str, scheduler: FakeScheduler) -> None:
        self.base, self.cafile, self.scheduler = base, cafile, scheduler

    def call(self, method: str, uri: str, body: Any = None, **kwargs: Any) -> requests.Response:
        headers = {"BCS-ClusterID": CLUSTER, **kwargs.pop("headers", {})}
        return requests.request(method, f"{self.base}/mesosdriver/v4/{uri}", json=body, headers=headers,
                                verify=self.cafile, timeout=20, **kwargs)

    def sent(self, method: str, uri: str, body: Any = None, **kwargs: Any) -> tuple[requests.Response, Recorded | None]:
        """The driver's answer and what reached the scheduler for it (``None``: nothing did)."""
        before = self.scheduler.count()
        response = self.call(method, uri, body, **kwargs)
        after = self.scheduler.requests[before:]
        assert len(after) <= 1
        return response, (after[0] if after else None)


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Driver]:
    scheduler = FakeScheduler("scheduler")
    data = tmp_path_factory.mktemp("driver")
    port = free_port()
    server = ServerProcess(
        [str(BIN / "bcs-middleware"), "serve", "--role", "driver", "--cluster-id", CLUSTER,
         "--scheduler", scheduler.url, "--data-dir", str(data), "--bind", f"127.0.0.1:{port}",
         "--workers", "1", "--threads", "4", "--graceful-timeout", "2"],
        port=port, scheme="https", timeout=60)
    try:
        yield Driver(f"https://localhost:{port}", str(data / "tls" / "ca.crt"), scheduler)
    finally:
        server.stop()
        scheduler.stop()


def _envelope(response: requests.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"result", "code", "message", "data"}, body
    return dict(body)


def test_application_create_becomes_a_scheduler_version_with_the_source_defaults(driver: Driver) -> None:
    app = copy.deepcopy(APPLICATION)
    app["metadata"]["name"] = "created"
    app["metadata"]["labels"]["io.tencent.bcs.netsvc.requestip.0"] = "127.0.0.1 | InnerIp=127.0.0.1; 127.0.0.2"
    response, sent = driver.sent("POST", "namespaces/nfsol/applications", app)
    assert _envelope(response)["result"] is True
    assert sent is not None and (sent.method, sent.path, sent.query) == ("POST", "/v1/apps", "")
    version = sent.json()
    assert (version["ID"], version["RunAs"], version["Kind"], version["Instances"]) == (
        "created", "nfsol", "application", 1)
    assert version["RestartPolicy"] == {"policy": "Always", "interval": 5, "backoff": 10, "maxtimes": 10}
    assert version["KillPolicy"] == {"gracePeriod": 10}
    assert version["Labels"]["io.tencent.bcs.netsvc.requestip.0"] == "127.0.0.1|InnerIp=127.0.0.1;127.0.0.2"
    assert version["PodObjectMeta"]["name"] == "created" and version["PodObjectMeta"]["namespace"] == "nfsol"
    assert version["raw_json"]["metadata"]["name"] == "created"
    container = version["Container"][0]
    docker = container["Docker"]
    assert docker["Image"] == "docker.hub.com/nfsol/log:92763" and docker["ForcePullImage"] is True
    assert (docker["Network"], docker["NetworkType"]) == ("BRIDGE", "cnm")
    assert docker["PortMappings"][0] == {"ContainerPort": 8090, "HostPort": 8090, "Name": "test-tcp", "Protocol": "TCP"}
    assert docker["Parameters"][1] == {"Key": "ulimit", "Value": "nproc=8092"}
    assert docker["Env"]["requests.cpu"] == "2000.000000" and docker["Env"]["limits.memory"] == "8.000000"
    assert docker["Env"]["test_env"] == "test_env"
    assert container["Resources"] == {"Cpus": 2.0, "Mem": 8.0, "Disk": 0.0} == container["LimitResoures"]
    assert container["DataClass"]["NetLimit"] == {"egressLimit": 100}
    assert container["Volumes"] == [{"ContainerPath": "/container/path", "HostPath": "/data/host/path", "Mode": "RW"}]
    check = container["HealthChecks"][0]
    # absent or zero → the driver's defaults; given → kept
    assert (check["delaySeconds"], check["intervalSeconds"], check["timeoutSeconds"],
            check["gracePeriodSeconds"]) == (10, 30, 5, 5)
    assert driver.scheduler.apps[("nfsol", "created")]["ID"] == "created"


def test_minimal_application_gets_the_default_restart_policy_group_and_limits_as_requests(driver: Driver) -> None:
    app = {"apiVersion": "v4", "kind": "application", "metadata": {"name": "minimal"},
           "spec": {"instance": 2, "template": {"spec": {"containers": [{
               "image": "nginx", "resources": {"limits": {"cpu": "0.5", "memory": "64"}},
               "healthChecks": [{"type": "TCP", "tcp": {"port": 80}}]}]}}}}
    response, sent = driver.sent("POST", "namespaces/ignored/applications", app)
    assert _envelope(response)["result"] is True, response.text
    assert sent is not None
    version = sent.json()
    assert version["RunAs"] == "defaultGroup" and version["RestartPolicy"] == {"policy": "OnFailure"}
    container = version["Container"][0]
    assert container["Resources"] == {"Cpus": 0.5, "Mem": 64.0, "Disk": 0.0}  # requests copied from limits
    assert container["Docker"]["ForcePullImage"] is False
    check = container["HealthChecks"][0]
    assert (check["delaySeconds"], check["intervalSeconds"], check["timeoutSeconds"],
            check["gracePeriodSeconds"]) == (10, 60, 20, 300)


def test_the_schedulers_refusal_is_relayed_as_it_answered(driver: Driver) -> None:
    app = copy.deepcopy(APPLICATION)
    app["metadata"]["name"] = "twice"
    assert _envelope(driver.call("POST", "namespaces/nfsol/applications", app))["result"] is True
    again = _envelope(driver.call("POST", "namespaces/nfsol/applications", app))
    assert again == {"result": False, "code": 1405201, "message": "(bcs-scheduler):application already exist",
                     "data": None}
    zero = copy.deepcopy(app)
    zero["metadata"]["name"], zero["spec"]["instance"] = "zero", 0
    assert _envelope(driver.call("POST", "namespaces/nfsol/applications", zero))["message"].endswith("instances error")


@pytest.mark.parametrize(
    ("method", "uri", "body", "expected"),
    [
        pytest.param("PUT", "namespaces/nfsol/applications?instances=2&args=resetAll", "app",
                     ("POST", "/v1/apps/nfsol/ri-test-rc-001/update", "instances=2&args=resetAll"), id="update"),
        pytest.param("PUT", "namespaces/nfsol/applications/rollback", "app",
                     ("POST", "/v1/apps/nfsol/ri-test-rc-001/update", "instances=1&kind=application"), id="rollback"),
        pytest.param("PUT", "namespaces/nfsol/applications/ri-test-rc-001/scale/3", None,
                     ("POST", "/v1/apps/nfsol/ri-test-rc-001/scale", "instances=3&kind=application"), id="scale"),
        pytest.param("DELETE", "namespaces/nfsol/applications/ri-test-rc-001?enforce=1", None,
                     ("DELETE", "/v1/apps/nfsol/ri-test-rc-001", "enforce=1&kind=application"), id="delete"),
        pytest.param("GET", "namespaces/nfsol/applications", None,
                     ("GET", "/v1/nfsol/apps", "kind=application"), id="list"),
        pytest.param("POST", "namespaces/defaultGroup/deployments", "deployment",
                     ("POST", "/v1/deployment/defaultGroup/deployment-test", ""), id="deployment-create"),
        pytest.param("PUT", "namespaces/defaultGroup/deployments?args=x", "deployment",
                     ("PUT", "/v1/deployment/defaultGroup/deployment-test", "args=x"), id="deployment-update"),
        pytest.param("PUT", "namespaces/defaultGroup/deployments/deployment-test/scale/4", None,
                     ("PUT", "/v1/deployment/defaultGroup/deployment-test/scale/4", ""), id="deployment-scale"),
        pytest.param("DELETE", "namespaces/defaultGroup/deployments/deployment-test?enforce=0", None,
                     ("DELETE", "/v1/deployment/defaultGroup/deployment-test", "enforce=0"), id="deployment-delete"),
        pytest.param("PUT", "namespaces/defaultGroup/deployments/deployment-test/pauseupdate", None,
                     ("POST", "/v1/deployment/defaultGroup/deployment-test/pauseupdate", ""), id="deployment-pause"),
        pytest.param("POST", "namespaces/nfsol/processes", "process", ("POST", "/v1/apps", ""), id="process-create"),
        pytest.param("PUT", "namespaces/nfsol/processes/gamesvr/scale/2", None,
                     ("POST", "/v1/apps/nfsol/gamesvr/scale", "instances=2&kind=process"), id="process-scale"),
        pytest.param("GET", "namespaces/nfsol/applications/ri-test-rc-001/taskgroups", None,
                     ("GET", "/v1/apps/nfsol/ri-test-rc-001/taskgroups", ""), id="taskgroups"),
        pytest.param("POST", "namespaces/nfsol/configmaps", "configmap", ("POST", "/v1/configmap", ""),
                     id="configmap-create"),
        pytest.param("PUT", "namespaces/nfsol/configmaps", "configmap", ("PUT", "/v1/configmap", ""),
                     id="configmap-update"),
        pytest.param("DELETE", "namespaces/nfsol/secrets/s1", None, ("DELETE", "/v1/secret/nfsol/s1", ""),
                     id="secret-delete"),
        pytest.param("GET", "cluster/resources", None, ("GET", "/v1/cluster/resources", ""), id="cluster-resources"),
    ],
)
def test_each_source_route_becomes_its_scheduler_call(driver: Driver, method: str, uri: str, body: str | None,
                                                     expected: tuple[str, str, str]) -> None:
    document = {"app": APPLICATION, "deployment": DEPLOYMENT, "configmap": CONFIGMAP, "process": PROCESS,
                None: None}[body]
    response, sent = driver.sent(method, uri, document)
    assert _envelope(response)["result"] is True, response.text
    assert sent is not None and (sent.method, sent.path, sent.query) == expected
    if body == "deployment":
        definition = sent.json()
        assert definition["version"]["Kind"] == "application" and definition["version"]["RunAs"] == "defaultGroup"
        assert definition["selector"] == {"podname": "deployment-test"}
        # raw_json is the document as Go read it: the sample's "MaxRetries" and "IntersectionItem"
        # in their tags' spelling, the keys Go ignores ("selector", "autoUpgrade", "pause") as sent
        expected = copy.deepcopy(DEPLOYMENT)
        expected["updatePolicy"]["maxRetries"] = expected["updatePolicy"].pop("MaxRetries")
        expected["constraint"]["intersectionItem"] = expected["constraint"].pop("IntersectionItem")
        assert definition["strategy"]["type"] == "RollingUpdate" and definition["raw_json"] == expected
    if body == "process":
        version = sent.json()
        assert (version["Kind"], version["Container"], version["Process"]) == ("process", [],
                                                                              PROCESS["spec"]["template"]["spec"]["processes"])
    if body == "configmap":
        assert sent.json() == CONFIGMAP  # configmaps, secrets and services go as sent
    if body is None:
        assert sent.body == b""


@pytest.mark.parametrize(
    ("uri", "document", "bcs_code"),
    [
        pytest.param("namespaces/nfsol/applications", {**APPLICATION, "kind": "deployment"},
                     BCS_REQUEST_DATA_ERR, id="kind"),
        pytest.param("namespaces/nfsol/applications",
                     {**APPLICATION, "metadata": {**APPLICATION["metadata"], "name": "a.b"}},
                     BCS_DRIVER_PARAMETER_ERR, id="dot"),
        pytest.param("namespaces/nfsol/applications",
                     {**APPLICATION, "restartPolicy": {"policy": "Sometimes"}}, BCS_DRIVER_PARAMETER_ERR, id="restart"),
        pytest.param("namespaces/nfsol/applications", {**APPLICATION, "spec": {"instance": 1}},
                     BCS_DRIVER_PARAMETER_ERR,
                     id="no-template"),
        pytest.param("namespaces/nfsol/applications", {**APPLICATION, "spec": {"instance": "1"}}, BCS_JSON_DECODE,
                     id="wrong-type"),
        pytest.param("namespaces/nfsol/configmaps", {**CONFIGMAP, "kind": "secret"},
                     BCS_REQUEST_DATA_ERR, id="configmap-kind"),
        # Go reads "Kind" for "kind" and takes the last: a configmap body that is a secret to Go.
        pytest.param("namespaces/nfsol/configmaps", {**CONFIGMAP, "Kind": "secret"},
                     BCS_REQUEST_DATA_ERR, id="kind-in-another-case-last-wins"),
    ],
)
def test_documents_the_source_refuses_never_reach_the_scheduler(driver: Driver, uri: str, document: Any,
                                                                bcs_code: int) -> None:
    response, sent = driver.sent("POST", uri, document)
    assert response.status_code == 400, response.text
    # The driver answers in the source's envelope, with the source's error number.
    assert response.json() == {"result": False, "code": bcs_code, "message": response.json()["message"], "data": None}
    assert sent is None


def test_body_values_cannot_add_scheduler_path_segments_or_query_parameters(driver: Driver) -> None:
    app = copy.deepcopy(APPLICATION)
    app["metadata"]["namespace"] = "x/../../cluster/resources?"
    response, sent = driver.sent("PUT", "namespaces/x/applications?instances=1&args=a%26kind%3Dprocess", app)
    assert sent is not None, response.text
    # one path segment, encoded; the scheduler's router sees no route of its own in it
    assert sent.raw_uri.startswith("/v1/apps/x%2F..%2F..%2Fcluster%2Fresources%3F/ri-test-rc-001/update?")
    from urllib.parse import parse_qs

    assert parse_qs(sent.query) == {"instances": ["1"], "args": ["a&kind=process"]}
    response, sent = driver.sent("PUT", "namespaces/x/applications/web/scale/1%3Fkind=x", None)
    assert response.status_code == 400 and sent is None
    dots = {**APPLICATION, "metadata": {**APPLICATION["metadata"], "namespace": ".."}}
    response, sent = driver.sent("PUT", "namespaces/x/applications", dots)
    assert response.status_code == 400 and sent is None


def test_routes_the_source_does_not_convert_are_forwarded_unchanged(driver: Driver) -> None:
    # documented in the source's api-scheduler.md, but commented out of its driver's router
    response, sent = driver.sent("POST", "agentsettings/update?x=1", {"ips": ["127.0.0.1"]})
    assert response.status_code == 200 and sent is not None
    assert (sent.method, sent.path, sent.query) == ("POST", "/v4/agentsettings/update", "x=1")
