"""``--audit-webhook-mode blocking-strict`` through a real ``serve``: kube-apiserver's mode, where a
request's ``RequestReceived`` event is delivered before the request is served and a failure to
deliver it answers ``500`` (``k8s.io/apiserver/pkg/endpoints/filters/audit.go``: "failed to
store audit event"). The gateway delivers it right before the proxy forwards the request: with
the receiver down nothing reaches the cluster — neither a request nor an exec upgrade; with it
up the event is at the receiver before the cluster sees the request.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
import websocket

from tests.audit.export.receivers import WebhookReceiver, webhook_receiver
from tests.support.fake_apiserver import FakeAPIServer, RequestInfo, UpgradeRequest
from tests.support.gateway import CLI, SA_TOKEN, Gateway, register_cluster, served_gateway
from tests.support.polling import wait_for

from .test_webhook_export import export_args, metric

CLUSTER = "BCS-K8S-STRICT"
PODS = f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods"


class World:
    def __init__(self, gw: Gateway, api: FakeAPIServer, receiver: WebhookReceiver, token: str) -> None:
        self.gw, self.api, self.receiver, self.token = gw, api, receiver, token
        #: For each pod the apiserver was asked about: the RequestReceived URIs the receiver held then.
        self.held_when_seen: dict[str, list[str]] = {}
        self.upgrades: list[UpgradeRequest] = []

    def received_uris(self, stage: str = "RequestReceived") -> list[str]:
        return [e["requestURI"] for e in self.receiver.received() if e["stage"] == stage]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("strict")
    with FakeAPIServer(token=SA_TOKEN) as api, webhook_receiver() as receiver:
        for name in ("p1", "p2", "p3"):
            api.create("pods", {"metadata": {"name": name, "namespace": "default"},
                                "spec": {"containers": [{"name": "app", "image": "busybox"}]}}, "default")
        args = export_args(receiver, tmp, "--audit-webhook-mode", "blocking-strict")
        with served_gateway(tmp / "data", args=args, workers=1) as gw:
            register_cluster(gw, CLUSTER, server_url=api.url, ca_pem=api.ca_pem)
            token = gw.user("dora-strict")
            gw.grant("dora-strict", "edit", CLUSTER)
            w = World(gw, api, receiver, token)

            def authorizer(info: RequestInfo) -> bool:
                if info.resource == "pods" and info.name:
                    w.held_when_seen.setdefault(info.name, w.received_uris())
                return True

            api.authorize(authorizer)
            api.on_upgrade(w.upgrades.append)
            try:
                yield w
            finally:
                api.authorize(None)
                api.on_upgrade(None)


def _seen(world: World, pod: str) -> int:
    return len(world.api.requests.matching(f"/api/v1/namespaces/default/pods/{pod}"))


def test_the_request_event_reaches_the_receiver_before_the_cluster_sees_the_request(world: World) -> None:
    status, body = world.gw.call("GET", f"{PODS}/p1", token=world.token)
    assert status == 200, body
    assert any(uri.endswith("/pods/p1") for uri in world.held_when_seen["p1"]), world.held_when_seen


def test_with_the_receiver_down_the_request_is_refused_and_nothing_is_forwarded(world: World) -> None:
    dropped = metric(world.gw, "bcs_audit_events_retried_total", backend="webhook")
    world.receiver.down()
    try:
        status, body = world.gw.call("GET", f"{PODS}/p2", token=world.token)
        assert status == 500, body
        doc = json.loads(body)
        assert doc["kind"] == "Status" and doc["code"] == 500 and "audit" in doc["message"], doc
        assert _seen(world, "p2") == 0
        # An exec upgrade the same: refused before anything is sent, so no stream is opened.
        count = len(world.upgrades)
        with pytest.raises(websocket.WebSocketBadStatusException) as refused:
            websocket.create_connection(
                f"wss://localhost:{world.gw.server.port}{PODS}/p2/exec?container=app&command=ls&stdout=true",
                header=[f"Authorization: Bearer {world.token}"], subprotocols=["v5.channel.k8s.io"],
                sslopt={"ca_certs": world.gw.ca_file}, timeout=30)
        assert refused.value.status_code == 500
        assert len(world.upgrades) == count and _seen(world, "p2") == 0
        assert metric(world.gw, "bcs_audit_events_retried_total", backend="webhook") > dropped
    finally:
        world.receiver.up()
    # Back up: requests go through again, and what was refused is on record (spooled, then sent):
    # its RequestReceived and a ResponseComplete with the 500.
    status, body = world.gw.call("GET", f"{PODS}/p3", token=world.token)
    assert status == 200, body
    assert any(uri.endswith("/pods/p3") for uri in world.held_when_seen["p3"])

    def refused_on_record() -> bool:
        complete = [e for e in world.receiver.received() if e["stage"] == "ResponseComplete"
                    and e["requestURI"].endswith("/pods/p2")]
        return any(e["responseStatus"]["code"] == 500 for e in complete) and \
            any(uri.endswith("/pods/p2") for uri in world.received_uris())

    wait_for(refused_on_record, 60, "the refused request's events to arrive once the receiver is back")


def test_a_request_the_gateway_answers_itself_is_not_failed_by_the_receiver(world: World) -> None:
    # Nothing is forwarded for a request refused for its token: its answer stays the 401.
    world.receiver.down()
    try:
        status, _ = world.gw.call("GET", f"{PODS}/p1", token="")
        assert status == 401
    finally:
        world.receiver.up()


def test_serve_help_says_what_each_mode_costs() -> None:
    shown = subprocess.run([CLI, "serve", "--help"], capture_output=True, text=True, timeout=60)
    text = " ".join(shown.stdout.split())
    assert "blocking-strict: as blocking, and the request's RequestReceived event is delivered before it is " \
           "forwarded" in text
    assert "a request never waits" in text
