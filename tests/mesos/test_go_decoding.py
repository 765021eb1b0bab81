"""bcs v4 bodies read as the source's Go driver reads them: gateway → driver → scheduler, admitted.

Real processes: a gateway (``bcs-middleware serve --static-driver``) and a driver (``serve --role
driver``) sharing one SQLite database, the validating fake scheduler, and a real HTTPS bcs webhook
(the mesos-driver protocol: the object in, the whole object out). The webhook records what it
judged, adds the label ``admitted: "yes"``, and refuses (HTTP 403) any object with a privileged
container or the label ``deny``; the definitions (Create and Update of applications, Create of
deployments) are made through the gateway's Mesos path, as bcs-api's clients make them.

The fixtures under ``fixtures/source-docs/`` are the source's own documents, verbatim, from
TencentBlueKing/bk-bcs ``29cb7354``: ``api-scheduler-createApplication.json`` and
``api-scheduler-createDeployment.json`` (``docs/apidoc/api-scheduler.md``),
``bcs-client-appCreate.json`` and ``bcs-client-deploymentcreate.json``
(``docs/features/bcs-client/bcs-client_HANDBOOK.md``) and ``template-application.json``
(``docs/templates/mesos-artifact/application.md``, its ``A|B`` placeholders set to ``A``). They
spell ``networkType`` (tag ``networktype``), ``IntersectionItem`` (``intersectionItem``),
``MaxRetries`` (``maxRetries``) and ``KeyOrPath`` (``keyOrPath``) as bk-bcs's SaaS sends them, and
carry keys the Go types do not have (``appname``, ``constraint.selector``, ``autoUpgrade``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import ssl
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_scheduler import FakeScheduler, Recorded
from tests.support.polling import wait_until
from tests.support.servers import BIN, ServerProcess, free_port
from tests.support.webhooks import served_webhook

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "webhooks"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

CLI = str(BIN / "bcs-middleware")
ADMIN = "go-decoding-admin-token-" + "g" * 20
CLUSTER = "BCS-MESOS-GODEC"
PREFIX = "/bcsapi/v4/scheduler/mesos/"
DOCS = Path(__file__).parent / "fixtures" / "source-docs"
# bcs-common/common/errorCode.go
FILTER_FAILED, JSON_DECODE, REQUEST_DATA_ERR = 1405234, 1405010, 1405008


def doc(name: str) -> dict[str, Any]:
    return dict(json.loads((DOCS / name).read_text()))


@dataclass
class BcsWebhook:
    """The mesos-driver's webhook protocol: the object in, the whole (changed) object out."""

    seen: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def judged(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [o for o in self.seen if (o.get("metadata") or {}).get("name") == name]

    def app(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        obj = json.loads(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
        with self.lock:
            self.seen.append(copy.deepcopy(obj))
        spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if "deny" in labels or any(c.get("privileged") is True for c in spec.get("containers") or []):
            payload = b'{"message": "privileged containers are not allowed"}'
            start_response("403 Forbidden", [("Content-Type", "application/json"),
                                             ("Content-Length", str(len(payload)))])
            return [payload]
        obj.setdefault("metadata", {}).setdefault("labels", {})["admitted"] = "yes"
        payload = json.dumps(obj).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))])
        return [payload]


@dataclass
class Stack:
    gateway: str
    gateway_ca: str
    driver: str
    driver_ca: str
    scheduler: FakeScheduler
    webhook: BcsWebhook

    def call(self, method: str, uri: str, body: bytes | None, *, content_type: str = "application/json",
             direct: bool = False) -> tuple[int, Any]:
        """``uri`` through the gateway's Mesos route (``direct``: straight to the driver)."""
        base, cafile = ((self.driver + "/mesosdriver/v4/", self.driver_ca) if direct
                        else (self.gateway + PREFIX, self.gateway_ca))
        headers = {"BCS-ClusterID": CLUSTER, "Content-Type": content_type, "Authorization": f"Bearer {ADMIN}"}
        req = urllib.request.Request(base + uri, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30, context=ssl.create_default_context(cafile=cafile)) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def sent(self, method: str, uri: str, body: bytes | None, **kwargs: Any) -> tuple[int, Any, Recorded | None]:
        """The answer and what reached the scheduler for it (``None``: nothing did)."""
        before = self.scheduler.count()
        status, answer = self.call(method, uri, body, **kwargs)
        after = self.scheduler.requests[before:]
        assert len(after) <= 1
        return status, answer, (after[0] if after else None)


def _definition(name: str, operation: str, kind: str, url: str, ca_bundle: str) -> dict[str, Any]:
    return {"apiVersion": "v4", "kind": "admissionwebhook", "metadata": {"name": name, "namespace": "prod"},
            "resourcesRef": {"operation": operation, "kind": kind},
            "admissionWebhooks": [{"name": "guard", "failurePolicy": "Fail",
                                   "clientConfig": {"caBundle": ca_bundle, "url": url}}]}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    import sidecar_injector

    tmp = tmp_path_factory.mktemp("go-decoding")
    hook = BcsWebhook()
    with contextlib.ExitStack() as running:
        served = running.enter_context(served_webhook(hook.app, names=("127.0.0.1",)))
        sidecar = running.enter_context(served_webhook(sidecar_injector.app, names=("127.0.0.1",)))
        scheduler = FakeScheduler("scheduler")
        running.callback(scheduler.stop)
        gw_data, driver_data = tmp / "gw", tmp / "driver"
        gw_port, driver_port = free_port(), free_port()
        running.enter_context(ServerProcess(
            [CLI, "serve", "--role", "driver", "--cluster-id", CLUSTER, "--scheduler", scheduler.url,
             "--data-dir", str(driver_data), "--bind", f"127.0.0.1:{driver_port}", "--workers", "1",
             "--threads", "8", "--graceful-timeout", "2", "--database-url", f"sqlite:///{gw_data / 'bcs.sqlite3'}"],
            port=driver_port, scheme="https", timeout=60))
        running.enter_context(ServerProcess(
            [CLI, "serve", "--static-driver", f"{CLUSTER}=https://127.0.0.1:{driver_port}",
             "--driver-ca-file", str(driver_data / "tls" / "ca.crt"), "--data-dir", str(gw_data),
             "--bind", f"127.0.0.1:{gw_port}", "--workers", "1", "--threads", "8", "--graceful-timeout", "2"],
            port=gw_port, env={"BCS_ADMIN_TOKEN": ADMIN}, scheme="https", timeout=60))
        made = Stack(f"https://localhost:{gw_port}", str(gw_data / "tls" / "ca.crt"),
                     f"https://localhost:{driver_port}", str(driver_data / "tls" / "ca.crt"), scheduler, hook)
        rest = urllib.request.Request(made.gateway + "/rest/clusters/bcs", method="POST",
                                      data=json.dumps({"id": CLUSTER, "project_id": "p",
                                                       "cluster_type": "mesos"}).encode(),
                                      headers={"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"})
        with urllib.request.urlopen(rest, timeout=30,
                                    context=ssl.create_default_context(cafile=made.gateway_ca)) as resp:
            assert resp.status == 201
        for name, operation, kind, target in (
                ("apps", "Create", "Application", served), ("app-updates", "Update", "Application", served),
                ("deployments", "Create", "Deployment", served),
                # the example sidecar injector (examples/webhooks/) on deployment updates
                ("sidecars", "Update", "Deployment", sidecar)):
            definition = _definition(name, operation, kind, f"https://127.0.0.1:{target.port}/", target.ca_bundle)
            status, answer = made.call("POST", "namespaces/prod/admissionwebhook", json.dumps(definition).encode())
            assert status == 201, answer
        probe = {"apiVersion": "v4", "kind": "application", "metadata": {"name": "probe", "namespace": "defaultGroup"},
                 "spec": {"instance": 1, "template": {"spec": {"containers": [{"image": "nginx"}]}}}}
        # the driver reads the definitions from the shared database within its refresh bound
        assert wait_until(lambda: made.call("POST", "namespaces/defaultGroup/applications",
                                            json.dumps(probe).encode())[0] == 200 and hook.judged("probe"), 30, 0.3)
        yield made


# --------------------------------------------------------------------------- the source's own documents

APPLICATIONS = "namespaces/defaultGroup/applications"
DEPLOYMENTS = "namespaces/defaultGroup/deployments"


@pytest.mark.parametrize(("fixture", "uri"), [
    pytest.param("api-scheduler-createApplication.json", APPLICATIONS, id="api-doc-application"),
    pytest.param("bcs-client-appCreate.json", APPLICATIONS, id="bcs-client-application"),
    pytest.param("template-application.json", "namespaces/nfsol/applications", id="template-application"),
    pytest.param("api-scheduler-createDeployment.json", DEPLOYMENTS, id="api-doc-deployment"),
    pytest.param("bcs-client-deploymentcreate.json", DEPLOYMENTS, id="bcs-client-deployment"),
])
def test_the_sources_documented_bodies_go_through_admitted_in_the_tags_spelling(
        stack: Stack, fixture: str, uri: str, request: pytest.FixtureRequest) -> None:
    body = doc(fixture)
    name = f"doc-{request.node.callspec.id}"
    body["metadata"]["name"] = name
    sent_text = json.dumps(body).encode()
    assert b'"networkType"' in sent_text  # as the documents (and bk-bcs's SaaS) spell it
    status, answer, sent = stack.sent("POST", uri, sent_text)
    assert status == 200 and answer["result"] is True, answer  # the scheduler's envelope, relayed
    [judged] = stack.webhook.judged(name)
    pod = judged["spec"]["template"]["spec"]
    # the webhook judged the document as Go reads it: the tags' spelling, one of each
    assert "networkType" not in pod and pod["networktype"] in ("BRIDGE", "cnm")
    assert "IntersectionItem" not in judged.get("constraint", {})
    if "updatePolicy" in body:
        assert judged["updatePolicy"]["maxRetries"] == 10 and "MaxRetries" not in judged["updatePolicy"]
    if fixture == "template-application.json":
        items = pod["containers"][0]["configmaps"][0]["items"]
        assert items[1]["keyOrPath"] == "/data/contianer/path/filename.txt" and "KeyOrPath" not in items[1]
    if fixture == "api-scheduler-createApplication.json":
        assert judged["appname"] == "app-test"  # Go ignores it; forwarded as sent
    # ... and the scheduler got exactly what the webhook admitted
    assert sent is not None
    definition = sent.json()
    admitted = {**judged, "metadata": {**judged["metadata"], "labels": {**judged["metadata"].get("labels", {}),
                                                                        "admitted": "yes"}}}
    assert definition["raw_json"] == admitted
    version = definition["version"] if "deployment" in fixture.lower() else definition
    assert version["Container"][0]["Docker"]["NetworkType"] == pod["networktype"]


def test_a_documented_body_as_yaml_through_the_gateway_is_read_alike(stack: Stack) -> None:
    import yaml

    body = doc("bcs-client-appCreate.json")
    body["metadata"]["name"] = "doc-as-yaml"
    status, answer, sent = stack.sent("POST", APPLICATIONS, yaml.safe_dump(body).encode(),
                                      content_type="application/x-yaml")
    assert status == 200 and answer["result"] is True, answer
    [judged] = stack.webhook.judged("doc-as-yaml")
    assert judged["spec"]["template"]["spec"]["networktype"] == "BRIDGE"
    assert sent is not None and sent.json()["raw_json"]["spec"]["template"]["spec"]["networktype"] == "BRIDGE"


# --------------------------------------------------------------------------- a key in several spellings


def _application(name: str) -> dict[str, Any]:
    body = doc("bcs-client-appCreate.json")
    body["metadata"]["name"] = name
    return body


def test_a_field_in_two_spellings_is_read_as_go_reads_it_so_the_webhook_judges_what_runs(stack: Stack) -> None:
    # Go applies each key in order: "Privileged" after "privileged" wins. The webhook sees the
    # privileged container the scheduler would have run, and refuses it.
    text = json.dumps(_application("two-spellings")).encode().replace(
        b'"privileged": false', b'"privileged": false, "Privileged": true')
    status, answer, sent = stack.sent("POST", APPLICATIONS, text)
    assert status == 400 and answer["code"] == FILTER_FAILED, answer
    assert "guard" in answer["message"] and sent is None
    [judged] = stack.webhook.judged("two-spellings")
    assert judged["spec"]["template"]["spec"]["containers"][0]["privileged"] is True


def test_an_object_in_two_spellings_is_merged_as_go_merges_it(stack: Stack) -> None:
    # A second "Metadata" is decoded into the first: the labels of both, the name of the first.
    body = _application("merged")
    text = json.dumps(body).encode()[:-1] + b', "Metadata": {"labels": {"team": "blue"}}}'
    status, answer, sent = stack.sent("POST", APPLICATIONS, text)
    assert status == 200 and answer["result"] is True, answer
    [judged] = stack.webhook.judged("merged")
    assert judged["metadata"]["labels"] == {"podname": "app-test", "team": "blue"} and "Metadata" not in judged
    assert sent is not None and sent.json()["ObjectMeta"]["labels"] == {"podname": "app-test", "team": "blue",
                                                                        "admitted": "yes"}


def test_a_label_only_a_case_insensitive_reader_finds_is_judged_by_the_webhook(stack: Stack) -> None:
    # "LABELS" is metadata.labels to Go: the webhook's "deny" rule must see it.
    body = _application("hidden-label")
    body["metadata"]["LABELS"] = {"deny": "yes"}
    status, answer, sent = stack.sent("POST", APPLICATIONS, json.dumps(body).encode())
    assert status == 400 and answer["code"] == FILTER_FAILED and sent is None, answer


# --------------------------------------------------------------------------- keys twice, numbers


@pytest.mark.parametrize("direct", [False, True], ids=["through-the-gateway", "at-the-driver"])
@pytest.mark.parametrize(("text", "pointer"), [
    pytest.param(b'{"apiVersion": "v4", "kind": "application", "kind": "deployment"}', "/kind", id="top-level"),
    pytest.param(b'{"apiVersion": "v4", "kind": "application", "metadata": {"name": "dup", "namespace": "x", '
                 b'"namespace": "kube-system"}}', "/metadata/namespace", id="nested"),
])
def test_a_json_key_twice_is_refused_naming_it_and_nothing_is_judged_or_forwarded(
        stack: Stack, text: bytes, pointer: str, direct: bool) -> None:
    judged = len(stack.webhook.seen)
    status, answer, sent = stack.sent("POST", APPLICATIONS, text, direct=direct)
    assert status == 400, answer
    assert answer["result"] is False and f"twice at {pointer}" in answer["message"], answer
    assert sent is None and len(stack.webhook.seen) == judged


def test_a_yaml_key_twice_is_refused_at_the_gateway_naming_it(stack: Stack) -> None:
    text = (b"apiVersion: v4\nkind: application\nmetadata:\n  name: dup-yaml\n  namespace: prod\n"
            b"spec:\n  instance: 1\nspec:\n  instance: 2\n")
    status, answer, sent = stack.sent("POST", APPLICATIONS, text, content_type="application/x-yaml")
    assert status == 400 and "twice at /spec (line 8)" in answer["message"], answer
    assert sent is None and not stack.webhook.judged("dup-yaml")


@pytest.mark.parametrize(("value", "code"), [
    pytest.param(b"9223372036854775808", 1405007, id="beyond-int64"),
    pytest.param(b"1.5", JSON_DECODE, id="fraction-for-an-int"),
    pytest.param(b"1e2", JSON_DECODE, id="exponent-for-an-int"),
    pytest.param(b'"1"', JSON_DECODE, id="string-for-an-int"),
])
def test_numbers_the_go_types_refuse_are_refused_before_any_webhook(stack: Stack, value: bytes, code: int) -> None:
    body = _application("numbers")
    text = json.dumps(body).encode().replace(b'"instance": 1', b'"instance": ' + value)
    judged = len(stack.webhook.seen)
    status, answer, sent = stack.sent("POST", APPLICATIONS, text)
    assert status == 400 and answer["code"] == code, answer
    assert sent is None and len(stack.webhook.seen) == judged


def test_a_configmap_reaches_the_scheduler_as_the_reencoding_of_what_was_read(stack: Stack) -> None:
    # No definition covers configmaps: nothing judges them, and the driver still forwards what it read
    # — the tags' spelling ("RemoteUser" is the field's Go name: its tag is misspelt "josn" in the
    # source), compact — never the client's bytes.
    text = (b'{ "apiVersion": "v4", "Kind": "configmap", "metadata": {"name": "cm", "namespace": "prod"},\n'
            b' "Datas": {"item": {"type": "http", "content": "x", "remoteUser": "u"}} }')
    status, answer, sent = stack.sent("POST", "namespaces/prod/configmaps", text)
    assert status == 200 and answer["result"] is True, answer
    assert sent is not None and sent.body == (
        b'{"apiVersion":"v4","kind":"configmap","metadata":{"name":"cm","namespace":"prod"},'
        b'"datas":{"item":{"type":"http","content":"x","RemoteUser":"u"}}}')


def test_the_example_sidecar_injector_adds_a_container_the_driver_and_scheduler_read(stack: Stack) -> None:
    body = doc("bcs-client-deploymentcreate.json")
    body["metadata"]["name"] = "with-sidecar"
    status, answer, sent = stack.sent("PUT", DEPLOYMENTS, json.dumps(body).encode())
    assert status == 200 and answer["result"] is True, answer
    assert sent is not None and (sent.method, sent.path) == ("PUT", "/v1/deployment/defaultGroup/with-sidecar")
    definition = sent.json()
    app, sidecar = definition["version"]["Container"]
    assert sidecar["Docker"]["Image"] == "busybox:1.36" and sidecar["Type"] == app["Type"] == "MESOS"
    assert sidecar["Docker"]["Command"] == "sh"
    assert sidecar["Docker"]["Arguments"] == ["-c", "tail -F /var/log/app/*.log"]
    assert sidecar["LimitResoures"] == {"Cpus": 0.1, "Mem": 64.0, "Disk": 0.0}
    containers = definition["raw_json"]["spec"]["template"]["spec"]["containers"]
    assert [c.get("name") for c in containers] == [None, "sidecar"]
