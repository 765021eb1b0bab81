"""The rest of the source driver's router, through a real `serve --role driver` to the validating fake scheduler.

Routes and shapes from ``bcs-mesos-driver/mesosdriver/backend/v4http`` (``scheduler-api.go``,
``send.go``, ``taskgroup.go``, ``transaction.go``, ``daemonset.go``, ``crd.go``, ``fetch.go``) at
TencentBlueKing/bk-bcs ``1ff02e164^``. Fixtures: ``fixtures/daemonset.json`` is
``docs/templates/mesos-artifact/daemonset.md`` (its trailing comma removed, ``A|B`` placeholders
set to one value, ``networkType`` spelled as its tag); ``COMMAND`` is
``docs/templates/mesos-artifact/command.md``; the message and agent-setting bodies are the
examples of ``docs/apidoc/api-scheduler.md``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from bcs_middleware.scheduler.convert import BCS_DRIVER_PARAMETER_ERR, BCS_JSON_DECODE, BCS_REQUEST_DATA_ERR
from tests.mesos.test_convert import Driver, _envelope, driver  # noqa: F401  (the module's driver fixture)

DAEMONSET = json.loads((Path(__file__).parent / "fixtures" / "daemonset.json").read_text())
COMMAND = {"apiVersion": "v4", "kind": "Command", "spec": {
    "commandTargetRef": {"kind": "Application", "name": "app-test", "namespace": "defaultGroup"},
    "taskgroups": [], "command": ["/bin/bash", "-c", "ps -ef |grep game"], "env": [], "user": "root",
    "workingDir": "", "privileged": False, "reserveTime": 60}}
SIGNAL = {"name": "test_deployment", "namespace": "test", "msgtype": "signal",
          "msgdata": {"processname": "myprocess", "signal": 12}}
AGENTS = [{"innerIP": "127.0.0.1", "disabled": False, "strings": {"attr1": {"value": "1111"}}}]
TAINTS = [{"innerIP": "127.0.0.1", "noSchedule": {"key1": "value1"}}]
CRD = {"apiVersion": "v4", "kind": "crd", "metadata": {"name": "x", "namespace": "ns"}, "spec": {}}
TG = "0.test_deployment.test.10001.1543390043870110268"

_GO_MESSAGE = {"Id": 0, "TaskGroupId": "", "TaskID": None, "Status": "", "Message": "", "CompleteTime": 0,
               "CreateTime": 0}


@pytest.mark.parametrize(
    ("method", "uri", "body", "expected"),
    [
        pytest.param("POST", "namespaces/test/applications/test_deployment/message", SIGNAL,
                     ("POST", "/v1/apps/test/test_deployment/message", ""), id="message"),
        pytest.param("POST", f"namespaces/test/applications/test_deployment/taskgroups/{TG}/message", SIGNAL,
                     ("POST", f"/v1/apps/test/test_deployment/message/{TG}", ""), id="taskgroup-message"),
        pytest.param("PUT", f"namespaces/test/applications/app/taskgroups/{TG}/rescheduler?hostRetainTime=60", None,
                     ("PUT", f"/v1/taskgroup/{TG}/rescheduler", "hostRetainTime=60"), id="rescheduler"),
        pytest.param("PUT", f"namespaces/test/applications/app/taskgroups/{TG}/rescheduler", None,
                     ("PUT", f"/v1/taskgroup/{TG}/rescheduler", "hostRetainTime="), id="rescheduler-no-retain"),
        pytest.param("POST", f"namespaces/test/applications/app/taskgroups/{TG}/restart", None,
                     ("POST", f"/v1/taskgroup/{TG}/restart", ""), id="restart"),
        pytest.param("POST", f"namespaces/test/applications/app/taskgroups/{TG}/reload", None,
                     ("POST", f"/v1/taskgroup/{TG}/reload", ""), id="reload"),
        pytest.param("GET", "namespaces/test/applications/app/versions/1543390043", None,
                     ("GET", "/v1/apps/test/app/versions/1543390043", ""), id="fetch-version"),
        pytest.param("POST", "namespaces/nfsol/daemonset", DAEMONSET, ("POST", "/v1/daemonsets", ""), id="daemonset"),
        pytest.param("DELETE", "namespaces/nfsol/daemonset/ri-test-rc-001?enforce=1", None,
                     ("DELETE", "/v1/daemonsets/nfsol/ri-test-rc-001", "enforce=1"), id="daemonset-delete"),
        pytest.param("GET", "transactions/nfsol?objKind=application&objName=web", None,
                     ("GET", "/v1/transactions/nfsol", "objKind=application&objName=web"), id="transactions"),
        pytest.param("DELETE", "transactions/nfsol/t1", None, ("DELETE", "/v1/transactions/nfsol/t1", ""),
                     id="transaction-delete"),
        pytest.param("GET", "agentsettings?ips=127.0.0.1", None, ("GET", "/v1/agentsettings", "ips=127.0.0.1"),
                     id="agentsettings"),
        pytest.param("POST", "agentsettings", AGENTS, ("POST", "/v1/agentsettings", ""), id="agentsettings-set"),
        pytest.param("POST", "agentsettings/disable?ips=127.0.0.1", None,
                     ("POST", "/v1/agentsettings/disable", "ips=127.0.0.1"), id="agents-disable"),
        pytest.param("POST", "agentsettings/enable?ips=127.0.0.1", None,
                     ("POST", "/v1/agentsettings/enable", "ips=127.0.0.1"), id="agents-enable"),
        pytest.param("PUT", "agentsettings/taint", TAINTS, ("PUT", "/v1/agentsettings/taint", ""), id="taint"),
        pytest.param("PUT", "agentsettings/extendedresource", {"innerIP": "127.0.0.1", "name": "gpu", "value": 2},
                     ("PUT", "/v1/agentsettings/extendedresource", ""), id="extendedresource"),
        pytest.param("POST", "crr/register", CRD, ("POST", "/v1/crr/register", ""), id="crr-register"),
        pytest.param("POST", "crd/namespaces/ns/clb", CRD, ("POST", "/v1/crd/namespaces/ns/clb", ""), id="crd-create"),
        pytest.param("PUT", "crd/namespaces/ns/clb", CRD, ("PUT", "/v1/crd/namespaces/ns/clb", ""), id="crd-update"),
        pytest.param("DELETE", "crd/namespaces/ns/clb/x", None, ("DELETE", "/v1/crd/namespaces/ns/clb/x", ""),
                     id="crd-delete"),
        pytest.param("GET", "crd/namespaces/ns/clb/x", None, ("GET", "/v1/crd/namespaces/ns/clb/x", ""), id="crd-get"),
        pytest.param("GET", "crd/namespaces/ns/clb", None, ("GET", "/v1/crd/namespaces/ns/clb", ""), id="crd-list"),
        pytest.param("GET", "crd/clb", None, ("GET", "/v1/crd/clb", ""), id="crd-list-all"),
        pytest.param("POST", f"image/commit/{TG}?image=a:1&url=b:2", None,
                     ("POST", f"/v1/image/commit/{TG}", "image=a%3A1&url=b%3A2"), id="image-commit"),
        pytest.param("POST", "command/application/defaultGroup/app-test", COMMAND,
                     ("POST", "/v1/command/application/defaultGroup/app-test", ""), id="command-send"),
        pytest.param("GET", "command/application/defaultGroup/app-test?id=c1", None,
                     ("GET", "/v1/command/application/defaultGroup/app-test", "id=c1"), id="command-get"),
        pytest.param("DELETE", "command/deployment/defaultGroup/d?id=c1", None,
                     ("DELETE", "/v1/command/deployment/defaultGroup/d", "id=c1"), id="command-delete"),
        pytest.param("GET", "cluster/endpoints", None, ("GET", "/v1/cluster/endpoints", ""), id="endpoints"),
        pytest.param("GET", "definition/deployment/ns/d", None, ("GET", "/v1/definition/deployment/ns/d", ""),
                     id="definition"),
    ],
)
def test_each_remaining_source_route_becomes_its_scheduler_call(driver: Driver, method: str, uri: str,  # noqa: F811
                                                                body: Any, expected: tuple[str, str, str]) -> None:
    response, sent = driver.sent(method, uri, body)
    answer = _envelope(response)
    assert answer["result"] is True, answer  # the fake scheduler validated the payload
    assert sent is not None and (sent.method, sent.path, sent.query) == expected
    if body is None:
        assert sent.body == b""
    elif uri.endswith("/message"):
        assert sent.json() == {**_GO_MESSAGE, "Type": 2, "Sig": {"Signal": 12, "ProcessName": "myprocess"}}
    elif uri == "agentsettings/extendedresource":
        # ExtendedResource has no JSON tags: Go reads the sample's keys as its field names
        assert sent.json() == {"InnerIP": "127.0.0.1", "Name": "gpu", "Value": 2}
    elif body is not DAEMONSET:
        assert sent.json() == body  # the source relays these bodies unchanged
    if uri.startswith("command/application") and method == "POST":
        assert answer["data"] == "Application-defaultGroup-app-test-1"


@pytest.mark.parametrize(
    ("msgtype", "msgdata", "part"),
    [
        pytest.param("local", {"to": "/data/a.conf", "user": "root", "right": "0644", "ctx": "aGVsbG8="},
                     {"Local": {"To": "/data/a.conf", "Right": "0644", "User": "root", "Base64": "aGVsbG8="}},
                     id="local"),
        pytest.param("remote", {"to": "/data/a", "user": "u", "right": "r", "remote": "http://x/a"},
                     {"Remote": {"To": "/data/a", "Right": "r", "User": "u", "From": "http://x/a", "Type": None,
                                 "RemoteUser": None, "RemotePasswd": None}}, id="remote"),
        pytest.param("env-key", {"env-key": "K", "env-value": "V"}, {"Env": {"Name": "K", "Value": "V"}}, id="env"),
        pytest.param("env-key", {}, {"Env": {"Name": "", "Value": ""}}, id="env-absent-fields-empty"),
        pytest.param("signal", {"signal": 9}, {"Sig": {"Signal": 9, "ProcessName": ""}}, id="signal"),
    ],
)
def test_messages_become_the_bcs_message_send_go_builds(driver: Driver, msgtype: str, msgdata: Any,  # noqa: F811
                                                        part: dict[str, Any]) -> None:
    type_code = {"local": 1, "signal": 2, "env-key": 3, "remote": 4}[msgtype]
    response, sent = driver.sent("POST", "namespaces/ns/applications/app/message",
                                 {"msgtype": msgtype, "msgdata": msgdata})
    assert _envelope(response)["result"] is True, response.text
    assert sent is not None and sent.json() == {**_GO_MESSAGE, "Type": type_code, **part}


@pytest.mark.parametrize(
    ("document", "bcs_code"),
    [
        pytest.param({"msgtype": "reboot", "msgdata": {}}, 1405233, id="unknown-type"),
        pytest.param({"msgdata": {"signal": 9}}, 1405233, id="no-type"),
        pytest.param({"msgtype": "signal", "msgdata": {"signal": "9"}}, BCS_JSON_DECODE, id="signal-string"),
        pytest.param({"msgtype": "signal", "msgdata": {"signal": 2**32}}, BCS_JSON_DECODE, id="signal-wraps"),
        pytest.param({"msgtype": "signal", "msgdata": {}}, BCS_JSON_DECODE, id="signal-absent"),
        pytest.param({"msgtype": "local", "msgdata": {"to": ["/etc/passwd"]}}, BCS_JSON_DECODE, id="to-not-a-string"),
        pytest.param([1], BCS_JSON_DECODE, id="not-an-object"),
    ],
)
def test_messages_the_source_refuses_never_reach_the_scheduler(driver: Driver, document: Any,  # noqa: F811
                                                               bcs_code: int) -> None:
    response, sent = driver.sent("POST", "namespaces/ns/applications/app/message", document)
    assert response.status_code == 400, response.text
    assert response.json()["code"] == bcs_code and response.json()["result"] is False
    assert sent is None


def test_daemonset_becomes_a_daemonset_def_with_the_source_defaults(driver: Driver) -> None:  # noqa: F811
    response, sent = driver.sent("POST", "namespaces/ignored/daemonset", DAEMONSET)
    assert _envelope(response)["result"] is True, response.text
    assert sent is not None
    definition = sent.json()
    # ObjectMeta inline, then the Version
    assert set(definition) == {"name", "namespace", "creationTimestamp", "labels", "version"}
    assert (definition["name"], definition["namespace"]) == ("ri-test-rc-001", "nfsol")
    version = definition["version"]
    assert (version["ID"], version["RunAs"], version["Kind"], version["Instances"]) == (
        "ri-test-rc-001", "nfsol", "daemonset", 0)
    assert version["Constraints"] is None and "raw_json" not in version
    assert version["RestartPolicy"] == {"policy": "OnFailure"} and version["KillPolicy"] == {"gracePeriod": 10}
    assert version["Labels"] == {"test_label": "test_label"}
    container = version["Container"][0]
    assert container["Docker"]["ForcePullImage"] is True and container["Docker"]["NetworkType"] == "cnm"
    check = container["HealthChecks"][0]
    assert (check["delaySeconds"], check["intervalSeconds"], check["timeoutSeconds"],
            check["gracePeriodSeconds"]) == (10, 30, 5, 5)


@pytest.mark.parametrize(
    ("document", "bcs_code"),
    [
        pytest.param({**DAEMONSET, "kind": "application"}, BCS_REQUEST_DATA_ERR, id="kind"),
        pytest.param({**DAEMONSET, "metadata": {**DAEMONSET["metadata"], "name": "a.b"}}, BCS_DRIVER_PARAMETER_ERR,
                     id="dot"),
        pytest.param({**DAEMONSET, "restartPolicy": {"policy": "Sometimes"}}, BCS_DRIVER_PARAMETER_ERR, id="restart"),
        pytest.param({**DAEMONSET, "spec": {}}, BCS_DRIVER_PARAMETER_ERR, id="no-template"),
    ],
)
def test_daemonsets_the_source_refuses_never_reach_the_scheduler(driver: Driver, document: Any,  # noqa: F811
                                                                 bcs_code: int) -> None:
    response, sent = driver.sent("POST", "namespaces/nfsol/daemonset", document)
    assert response.status_code == 400, response.text
    assert response.json()["code"] == bcs_code
    assert sent is None


def test_the_schedulers_own_refusals_and_missing_routes_are_relayed(driver: Driver) -> None:  # noqa: F811
    # A command whose target is not the path's: the scheduler's refusal, as it answered.
    other = copy.deepcopy(COMMAND)
    other["spec"]["commandTargetRef"]["name"] = "someone-else"
    answer = _envelope(driver.call("POST", "command/application/defaultGroup/app-test", other))
    assert (answer["result"], answer["code"]) == (False, BCS_REQUEST_DATA_ERR)
    # The source's driver calls two routes its scheduler has commented out; the 404 is relayed.
    for method, uri, path in (("GET", "namespaces/ns/applications/app/tasks", "/v1/apps/ns/app/tasks"),
                              ("DELETE", "agentsettings?ips=127.0.0.1", "/v1/agentsettings/delete")):
        response, sent = driver.sent(method, uri)
        assert response.status_code == 404 and sent is not None and sent.path == path


def test_client_query_values_stay_one_value(driver: Driver) -> None:  # noqa: F811
    response, sent = driver.sent("POST", f"image/commit/{TG}?image=a%26url%3Devil&url=b")
    assert sent is not None, response.text
    assert parse_qs(sent.query) == {"image": ["a&url=evil"], "url": ["b"]}
    response, sent = driver.sent("GET", "transactions/ns?objKind=x%26objName%3Dy&extra=1")
    assert sent is not None and parse_qs(sent.query, keep_blank_values=True) == {"objKind": ["x&objName=y"],
                                                                                 "objName": [""]}


@pytest.mark.parametrize("uri", ["customresourcedefinitions", "customresourcedefinitions/x",
                                 "customresources/clb.bkbcs.tencent.com/v1/namespaces/ns/clbs"])
def test_custom_resources_of_the_kubeconfig_mode_are_not_served(driver: Driver, uri: str) -> None:  # noqa: F811
    response, sent = driver.sent("GET", uri)
    assert response.status_code == 404 and response.json()["result"] is False
    assert sent is None


@pytest.mark.parametrize(
    ("uri", "document", "status", "check"),
    [
        # Go's decoder takes each spelling in order, the last one winning: "clb", as Go reads it,
        # under the tag's spelling.
        pytest.param("crd/namespaces/ns/clb", {**CRD, "kind": "x", "Kind": "clb"}, 200,
                     lambda sent: sent["kind"] == "clb" and "Kind" not in sent, id="crd-kind-twice"),
        pytest.param("crd/namespaces/ns/clb", {k: v for k, v in CRD.items() if k != "kind"} | {"KIND": "clb"}, 200,
                     lambda sent: sent["kind"] == "clb" and "KIND" not in sent, id="crd-kind-in-another-case"),
        pytest.param("crd/namespaces/ns/clb", {**CRD, "metadata": {"name": "x", "namespace": "ns", "NameSpace": "p"}},
                     200, lambda sent: sent["metadata"] == {"name": "x", "namespace": "p"}, id="crd-namespace-twice"),
        # the configmap is a secret to Go: CheckKind refuses it, as the source's driver does
        pytest.param("namespaces/ns/configmaps", {"apiVersion": "v4", "kind": "configmap", "Kind": "secret",
                                                  "metadata": {"name": "c", "namespace": "ns"}}, 400,
                     None, id="configmap-twice"),
        pytest.param("command/application/defaultGroup/app-test",
                     {**COMMAND, "spec": {**COMMAND["spec"], "Command": ["rm", "-rf", "/"]}}, 200,
                     lambda sent: sent["spec"]["command"] == ["rm", "-rf", "/"] and "Command" not in sent["spec"],
                     id="nested-twice"),
        # a second, empty "Spec" is decoded into the first: nothing of it is lost
        pytest.param("namespaces/nfsol/applications",
                     {**json.loads((Path(__file__).parent / "fixtures" / "application.json").read_text()),
                      "Spec": {}}, 200,
                     lambda sent: sent["raw_json"]["spec"]["instance"] == 1 and "Spec" not in sent["raw_json"],
                     id="raw-json-twice"),
    ],
)
def test_bodies_are_forwarded_as_go_reads_them(driver: Driver, uri: str, document: Any, status: int,  # noqa: F811
                                              check: Any) -> None:
    response, sent = driver.sent("POST", uri, document)
    assert response.status_code == status, response.text
    if status == 400:
        assert response.json()["code"] == BCS_REQUEST_DATA_ERR and sent is None
    else:
        assert sent is not None and check(sent.json()), sent.json()
