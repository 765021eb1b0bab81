"""What a webhook judges is what the apiserver gets: attacks through a real ``bcs-middleware serve``.

One gateway (gunicorn, HTTPS, one worker) in front of the fake apiserver, which records every
request body exactly as it arrived, and one real HTTPS webhook behind two configurations:

* ``label`` (mutating, CREATE of pods): adds the label ``admitted: "yes"`` by JSON Patch;
* ``record`` (validating, CREATE of configmaps): allows everything.

The webhook keeps every object it was sent. A body the gateway decodes is forwarded as the
compact re-encoding of the admitted object — checked byte for byte against what the webhook saw
(plus its patch) — and a body the receiver would read otherwise than Python does (a key twice, a
number Go cannot hold) is refused naming the problem, with nothing forwarded.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import pytest
from werkzeug.wrappers import Request, Response

from tests.security.test_admission_bypass import send as send_as
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import CLUSTER, SA_TOKEN, Gateway, register_cluster, served_gateway
from tests.support.polling import wait_until
from tests.support.webhooks import ServedWebhook, served_webhook

TUNNEL = f"/tunnels/clusters/{CLUSTER}"
PODS = "/api/v1/namespaces/default/pods"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
SECRETS = "/api/v1/namespaces/default/secrets"
LABEL_PATCH = [{"op": "add", "path": "/metadata/labels", "value": {"admitted": "yes"}}]


def compact(obj: Any) -> bytes:
    """The re-encoding the apiserver must get: compact JSON, UTF-8, keys in their order."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass
class Webhook:
    seen: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def objects(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [r["object"] for r in self.seen if (r.get("object") or {}).get("metadata", {}).get("name") == name]

    def app(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        review = json.loads(request.get_data())
        req = review["request"]
        with self.lock:
            self.seen.append(req)
        answer: dict[str, Any] = {"uid": req["uid"], "allowed": True}
        if request.path == "/label":
            answer["patchType"] = "JSONPatch"
            answer["patch"] = base64.b64encode(json.dumps(LABEL_PATCH).encode()).decode()
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer}
        return Response(json.dumps(body), content_type="application/json")(environ, start_response)


@pytest.fixture(scope="module")
def webhook() -> Iterator[tuple[Webhook, ServedWebhook]]:
    hook = Webhook()
    with served_webhook(hook.app) as served:
        yield hook, served


def _configuration(kind: str, name: str, url: str, ca_bundle: str, resource: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": {"name": name},
        "webhooks": [{
            "name": f"{name}.example.com", "clientConfig": {"url": url, "caBundle": ca_bundle},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": [resource]}],
            "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"], "timeoutSeconds": 10,
        }],
    }


@pytest.fixture(scope="module")
def hook(webhook: tuple[Webhook, ServedWebhook]) -> Webhook:
    return webhook[0]


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=SA_TOKEN) as api:
        yield api


@pytest.fixture(scope="module")
def gateway(apiserver: FakeAPIServer, webhook: tuple[Webhook, ServedWebhook],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    hook, served = webhook
    with served_gateway(tmp_path_factory.mktemp("canonical-gateway"), workers=1) as gw:
        register_cluster(gw, CLUSTER, server_url=apiserver.url, ca_pem=apiserver.ca_pem)
        url = f"https://localhost:{served.port}"
        for config in (
            _configuration("MutatingWebhookConfiguration", "label", f"{url}/label", served.ca_bundle, "pods"),
            _configuration("ValidatingWebhookConfiguration", "record", f"{url}/record", served.ca_bundle,
                           "configmaps"),
        ):
            status, body = gw.call("POST", f"/rest/clusters/{CLUSTER}/admissionwebhookconfigurations", body=config)
            assert status == 201, body
        probe = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probe", "namespace": "default"}}
        # the admission refresh picks the configurations up within its bound
        assert wait_until(lambda: bool(send(gw, "POST", f"{TUNNEL}{CONFIGMAPS}", compact(probe))[0] == 201
                                       and hook.objects("probe")), 30, 0.3)
        yield gw


def send(gw: Gateway, method: str, path: str, body: bytes,
         content_type: str | None = "application/json") -> tuple[int, Any]:
    """One request carrying exactly these bytes, as the admin."""
    return send_as(gw, method, path, gw.admin, body, content_type=content_type)


def writes(api: FakeAPIServer, path: str) -> list[bytes]:
    return [r.body for r in api.requests.matching(path) if r.method in ("POST", "PUT", "PATCH")]


# --------------------------------------------------------------------------- duplicate keys


POD_HEAD = '"apiVersion":"v1","kind":"Pod","metadata":{"name":"%s","namespace":"default"}'
PRIVILEGED = '{"hostPID":true,"containers":[{"name":"a","image":"nginx","securityContext":{"privileged":true}}]}'
PLAIN = '{"containers":[{"name":"a","image":"nginx"}]}'


@pytest.mark.parametrize(("name", "text", "key", "where"), [
    # Python keeps the last "spec", Go's decoder merges both: a plain pod to the webhook, hostPID and
    # a privileged container to the apiserver.
    pytest.param("dup-top", "{" + POD_HEAD + ',"spec":' + PRIVILEGED + ',"spec":' + PLAIN + "}", "spec", "/spec",
                 id="spec-twice"),
    pytest.param("dup-nested", "{" + POD_HEAD + ',"spec":{"containers":[{"name":"a","image":"nginx",'
                 '"securityContext":{"privileged":true},"securityContext":{}}]}}', "securityContext",
                 "/spec/containers/0/securityContext", id="nested-in-a-container"),
    pytest.param("dup-label", '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"%s","namespace":"default",'
                 '"labels":{"tier":"web","tier":"privileged"}},"spec":' + PLAIN + "}", "tier",
                 "/metadata/labels/tier", id="label-twice"),
])
def test_a_key_twice_is_refused_naming_it_and_nothing_reaches_the_apiserver(
        gateway: Gateway, apiserver: FakeAPIServer, hook: Webhook, name: str, text: str, key: str,
        where: str) -> None:
    apiserver.requests.clear()
    status, body = send(gateway, "POST", f"{TUNNEL}{PODS}", (text % name).encode())
    assert status == 400, (status, body)
    assert body["kind"] == "Status" and body["reason"] == "BadRequest", body
    assert f'"{key}" twice at {where}' in body["message"], body["message"]
    assert writes(apiserver, PODS) == [] and hook.objects(name) == []


def test_a_key_twice_in_a_body_no_webhook_matches_goes_on_as_sent(gateway: Gateway, apiserver: FakeAPIServer) -> None:
    # Nothing judged a secret here: it streams to the apiserver untouched, which decides (strict
    # field validation refuses it there too).
    text = (b'{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "unjudged", "namespace": "default"},'
            b'  "type": "Opaque", "type": "Opaque"}')
    apiserver.requests.clear()
    send(gateway, "POST", f"{TUNNEL}{SECRETS}", text)
    assert writes(apiserver, SECRETS) == [text]


# --------------------------------------------------------------------------- what is forwarded


def test_the_apiserver_gets_the_reencoding_of_what_the_validating_webhook_saw(
        gateway: Gateway, apiserver: FakeAPIServer, hook: Webhook) -> None:
    text = ('{ "apiVersion" : "v1",\n "kind": "ConfigMap", "metadata": {"name": "spaced",'
            ' "namespace": "default"},\t"data": {"slash": "a\\/b", "e": "caf\\u00e9", "raw": "日本",'
            ' "quote": "\\"", "nl": "a\\nb"} }').encode()
    apiserver.requests.clear()
    status, body = send(gateway, "POST", f"{TUNNEL}{CONFIGMAPS}", text)
    assert status == 201, body
    [seen] = hook.objects("spaced")
    assert seen["data"] == {"slash": "a/b", "e": "café", "raw": "日本", "quote": '"', "nl": "a\nb"}
    assert writes(apiserver, CONFIGMAPS) == [compact(seen)]


def test_the_apiserver_gets_the_reencoding_of_what_the_mutating_webhook_made(
        gateway: Gateway, apiserver: FakeAPIServer, hook: Webhook) -> None:
    text = ("{" + POD_HEAD % "mutated" + ', "spec" : ' + PLAIN + "}").encode()
    apiserver.requests.clear()
    status, body = send(gateway, "POST", f"{TUNNEL}{PODS}", text)
    assert status == 201, body
    [seen] = hook.objects("mutated")
    assert writes(apiserver, PODS) == [compact(jsonpatch.apply_patch(seen, LABEL_PATCH))]


def test_a_body_without_a_content_type_is_admitted_and_reencoded_too(
        gateway: Gateway, apiserver: FakeAPIServer, hook: Webhook) -> None:
    text = b'{"apiVersion":"v1", "kind":"ConfigMap", "metadata":{"name":"untyped","namespace":"default"}}'
    apiserver.requests.clear()
    status, body = send(gateway, "POST", f"{TUNNEL}{CONFIGMAPS}", text, content_type=None)
    assert status == 201, body
    [seen] = hook.objects("untyped")
    assert writes(apiserver, CONFIGMAPS) == [compact(seen)]


# --------------------------------------------------------------------------- numbers and strings


def _configmap_with(name: str, fragment: str) -> bytes:
    head = '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"NAME","namespace":"default"},"x":'
    return (head.replace("NAME", name) + fragment + "}").encode()


@pytest.mark.parametrize("number", [
    pytest.param("9223372036854775808", id="int64-max-plus-one"),
    pytest.param("-9223372036854775809", id="int64-min-minus-one"),
    pytest.param("123456789012345678901234567890", id="thirty-digits"),
    pytest.param("1e400", id="float-overflow"),
    pytest.param("-1E400", id="negative-float-overflow"),
    pytest.param("[1, 2, 18446744073709551616]", id="in-an-array"),
])
def test_numbers_no_go_type_holds_are_refused(gateway: Gateway, apiserver: FakeAPIServer, hook: Webhook,
                                              number: str, request: pytest.FixtureRequest) -> None:
    name = f"num-{request.node.callspec.id}"
    apiserver.requests.clear()
    status, body = send(gateway, "POST", f"{TUNNEL}{CONFIGMAPS}", _configmap_with(name, number))
    assert status == 400, (status, body)
    assert "64 bits" in body["message"], body
    assert writes(apiserver, CONFIGMAPS) == [] and hook.objects(name) == []


@pytest.mark.parametrize(("number", "forwarded"), [
    pytest.param("9223372036854775807", b"9223372036854775807", id="int64-max"),
    pytest.param("-9223372036854775808", b"-9223372036854775808", id="int64-min"),
    pytest.param("1.0", b"1.0", id="a-float-stays-a-float"),
    pytest.param("1E2", b"100.0", id="exponent"),
    pytest.param("-0", b"0", id="negative-zero-integer"),
    pytest.param("-0.0", b"-0.0", id="negative-zero-float"),
    pytest.param("1e-400", b"0.0", id="underflow-is-zero-as-in-go"),
    pytest.param("0.1", b"0.1", id="shortest-repr"),
])
def test_numbers_go_holds_are_forwarded_as_the_same_number(
        gateway: Gateway, apiserver: FakeAPIServer, hook: Webhook, number: str, forwarded: bytes,
        request: pytest.FixtureRequest) -> None:
    name = f"ok-{request.node.callspec.id}"
    apiserver.requests.clear()
    status, body = send(gateway, "POST", f"{TUNNEL}{CONFIGMAPS}", _configmap_with(name, number))
    assert status == 201, body
    [sent] = writes(apiserver, CONFIGMAPS)
    assert sent.endswith(b',"x":' + forwarded + b"}"), sent
    assert sent == compact(hook.objects(name)[0])


def test_a_lone_surrogate_is_read_as_go_reads_it_by_the_webhook_and_the_apiserver(
        gateway: Gateway, apiserver: FakeAPIServer, hook: Webhook) -> None:
    text = (b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"surrogates","namespace":"default"},'
            b'"data":{"lone":"a\\ud800b","low":"\\udc00","pair":"\\ud83d\\ude00"}}')
    apiserver.requests.clear()
    status, body = send(gateway, "POST", f"{TUNNEL}{CONFIGMAPS}", text)
    assert status == 201, body
    [seen] = hook.objects("surrogates")
    # Go's decoder reads a lone surrogate escape as U+FFFD, a pair as the character it spells
    assert seen["data"] == {"lone": "a\ufffdb", "low": "\ufffd", "pair": "\U0001f600"}
    [sent] = writes(apiserver, CONFIGMAPS)
    assert sent == compact(seen) and "a\ufffdb".encode() in sent


@pytest.mark.parametrize(("text", "what"), [
    pytest.param(b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"keys","namespace":"default"},'
                 b'"data":{"a\\ud800":"1","a\\udc00":"2"}}', "twice", id="keys-one-to-go"),
    pytest.param(b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bad-utf8","namespace":"default"},'
                 b'"data":{"a":"\xff\xfe"}}', "UTF-8", id="invalid-utf-8"),
    pytest.param(b'\xef\xbb\xbf{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bom"}}', "not JSON",
                 id="byte-order-mark"),
    pytest.param(b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"nan","namespace":"default"},'
                 b'"x":NaN}', "not JSON", id="nan"),
])
def test_text_go_reads_otherwise_is_refused(gateway: Gateway, apiserver: FakeAPIServer, text: bytes,
                                            what: str) -> None:
    apiserver.requests.clear()
    status, body = send(gateway, "POST", f"{TUNNEL}{CONFIGMAPS}", text)
    assert status == 400, (status, body)
    assert what in body["message"], body
    assert writes(apiserver, CONFIGMAPS) == []


def test_the_answer_names_the_problem_without_echoing_control_characters(
        gateway: Gateway, apiserver: FakeAPIServer) -> None:
    text = (b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"ctl","namespace":"default",'
            b'"labels":{"a\\u001b[31m\\n":"1","a\\u001b[31m\\n":"2"}}}')
    status, body = send(gateway, "POST", f"{TUNNEL}{CONFIGMAPS}", text)
    assert status == 400, body
    assert "\x1b" not in body["message"] and "\n" not in body["message"]
    assert "\\u001b" in body["message"]
