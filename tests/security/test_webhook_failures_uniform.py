"""A webhook URL a user defines must not make the gateway a port scanner.

A cluster's ``edit`` holder (``mallory``, no superuser) defines an admission webhook configuration
and points its URL, in turn, at a closed port, a port that speaks plain TCP, a port that accepts
and stays silent, a filtered port (a bound socket whose accept queue is full: the SYN is dropped),
an address the operator's policy refuses, a TLS server whose certificate is from another CA, and
a TLS server that answers an HTTP error — then creates a pod through the tunnel. Whatever the
port did, she must read the same status and the same bytes, no sooner than the webhook's
timeout (so closed and silent take as long); the superuser reads what happened, at once.

The same holds for the one other thing a user configures that the gateway dials on admission's
behalf: the apiserver addresses her agent reported, read when a PUT is admitted.

One real ``bcs-middleware serve`` (one worker: what it is told is what it uses) with
``upstream_deny = 127.0.0.1/32, ::1``; the fake apiserver on 127.0.0.3, the ports on 127.0.0.2.
"""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
import trustme

from bcs_middleware.admission.client import PUBLIC_FAILURE, WebhookClient
from bcs_middleware.admission.definitions import parse_k8s_configuration
from bcs_middleware.admission.dry_run import review
from bcs_middleware.admission.engine import AdmissionEngine
from bcs_middleware.admission.store import MemoryDefinitionStore
from bcs_middleware.core import environ as env
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import ADMIN, SA_TOKEN, Gateway, gateway_ini, register_cluster, served_gateway
from tests.support.servers import TrapListener, free_port

CLUSTER = "uniform-c1"
CONFIGS = f"/rest/clusters/{CLUSTER}/admissionwebhookconfigurations"
ITEM = f"{CONFIGS}/validatingwebhookconfigurations/probe"
PODS = f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods"
#: The webhook's timeoutSeconds: a failure takes this long for mallory.
TIMEOUT = 2
HOST = "127.0.0.2"
JSON = {"Content-Type": "application/json"}


class Filtered:
    """A bound, listening socket that never accepts, its accept queue full: new SYNs are dropped."""

    def __init__(self) -> None:
        self.sock = socket.create_server((HOST, 0), backlog=0)
        self.port = int(self.sock.getsockname()[1])
        self.fillers = []
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            try:
                filler.connect((HOST, self.port))
            except BlockingIOError:
                pass
            self.fillers.append(filler)

    def close(self) -> None:
        for filler in self.fillers:
            filler.close()
        self.sock.close()


@dataclass
class World:
    gw: Gateway
    api: FakeAPIServer
    mallory: str
    targets: dict[str, tuple[str, str]]  # case -> (url, caBundle PEM)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("uniform")
    other_ca = trustme.CA().cert_pem.bytes().decode()
    speaking = TrapListener(HOST, answer=b"SSH-2.0-OpenSSH_9.2\r\n")
    silent = TrapListener(HOST, hold=True)
    filtered = Filtered()
    ini = gateway_ini(tmp / "gateway.ini", tmp / "data", upstream_deny="127.0.0.1/32, ::1",
                      # every failure is a call: an open breaker would answer without calling
                      admission_breaker_threshold="1000", admission_refresh="0.2s",
                      # reported addresses are used at once (the second test changes them)
                      cluster_cache_ttl="0")
    try:
        with FakeAPIServer(token=SA_TOKEN, host="127.0.0.3", cert_hosts=("127.0.0.3",)) as api, \
                served_gateway(tmp / "data", workers=1, args=["--config", str(ini)]) as gw:
            mallory = gw.user("mallory")
            register_cluster(gw, CLUSTER, server_url=api.url, ca_pem=api.ca_pem, token=mallory)
            port = api.url.rsplit(":", 1)[1]
            targets = {
                "closed": (f"https://{HOST}:{free_port(HOST)}/", other_ca),
                "plain-tcp": (f"https://{HOST}:{speaking.port}/", other_ca),
                "silent": (f"https://{HOST}:{silent.port}/", other_ca),
                "filtered": (f"https://{HOST}:{filtered.port}/", other_ca),
                "policy": (f"https://localhost:{free_port()}/", other_ca),
                "other-ca": (f"https://127.0.0.3:{port}/", other_ca),
                "http-error": (f"https://127.0.0.3:{port}/no-such-review", api.ca_pem),
            }
            yield World(gw, api, mallory, targets)
    finally:
        speaking.close()
        silent.close()
        filtered.close()


def _configuration(url: str, ca_pem: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "probe"},
        "webhooks": [{
            "name": "probe.example.com",
            "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_pem.encode()).decode()},
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods"]}],
            "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "timeoutSeconds": TIMEOUT,
        }],
    }


def _pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "app", "image": "nginx"}]}}


def _timed(gw: Gateway, token: str, method: str, path: str, body: dict[str, Any]) -> tuple[int, bytes, float]:
    started = time.monotonic()
    status, raw = gw.call(method, path, token=token, body=body, headers=JSON)
    return status, raw, time.monotonic() - started


def test_one_answer_whatever_the_webhook_port_did(world: World) -> None:
    gw = world.gw
    plain: dict[str, tuple[int, bytes, float]] = {}
    detailed: dict[str, tuple[int, str, float]] = {}
    first = True
    for case, (url, ca_pem) in world.targets.items():
        method, path = ("POST", CONFIGS) if first else ("PUT", ITEM)
        status, raw = gw.call(method, path, token=world.mallory, body=_configuration(url, ca_pem))
        assert status in (200, 201), (case, status, raw)  # a name, and IPs the policy allows
        first = False
        # Side by side: each is timed on its own, and the superuser's silent and filtered cases
        # wait out the timeout too (a timeout is what happened there).
        with ThreadPoolExecutor(2) as pool:
            hers = pool.submit(_timed, gw, world.mallory, "POST", PODS, _pod(f"m-{case}"))
            status, raw, took = _timed(gw, ADMIN, "POST", PODS, _pod(f"a-{case}"))
            plain[case] = hers.result()
        detailed[case] = (status, json.loads(raw)["message"], took)

    expected = f'failed calling webhook "probe.example.com": {PUBLIC_FAILURE}'
    bodies = {raw for _, raw, _ in plain.values()}
    assert len(bodies) == 1, {case: raw[:200] for case, (_, raw, _) in plain.items()}
    status, raw, _ = next(iter(plain.values()))
    assert status == 500 and json.loads(raw)["message"] == expected, raw
    for case, (_, _, took) in plain.items():
        assert TIMEOUT <= took < TIMEOUT + 10, (case, took)
    # The superuser reads what happened, and does not wait for it.
    causes = {"closed": "refused", "plain-tcp": "certificate verification failed", "silent": "timed out",
              "filtered": "timed out", "policy": "does not connect to this address",
              "other-ca": "certificate verification failed", "http-error": "answered HTTP 401"}
    for case, cause in causes.items():
        status, message, _ = detailed[case]
        assert status == 500 and cause in message, (case, message)
    assert detailed["closed"][2] < TIMEOUT - 0.5, detailed["closed"]
    assert not [r for r in world.api.requests if r.method == "POST" and r.path.endswith("/pods")]


def test_admissions_read_of_an_unreachable_apiserver_says_only_that(world: World) -> None:
    """A PUT is admitted after reading the object as its caller, at the addresses her agent reported."""
    gw = world.gw
    status, _ = gw.call("POST", "/rest/clusters/bcs", token=world.mallory,
                        body={"id": "uniform-c2", "project_id": "p", "cluster_type": "k8s"})
    assert status == 201
    register = gw.json("POST", "/rest/clusters/uniform-c2/register_tokens", token=world.mallory)["token"]
    assert gw.call("POST", "/rest/clusters/uniform-c2/admissionwebhookconfigurations", token=world.mallory,
                   body=_configuration(*world.targets["closed"]))[0] == 201
    path = "/tunnels/clusters/uniform-c2/api/v1/namespaces/default/pods/p1"
    answers = set()
    for case in ("closed", "plain-tcp", "filtered"):
        report = {"server_addresses": world.targets[case][0], "cacert_data": world.api.ca_pem,
                  "user_token": SA_TOKEN}
        assert gw.call("PUT", "/rest/clusters/uniform-c2/credentials", token=register, body=report)[0] == 200
        put = gw.call("PUT", path, token=world.mallory, body=_pod("p1"), headers=JSON)
        get = gw.call("GET", path, token=world.mallory)  # the tunnel's own answer
        assert put == get, (case, put, get)
        answers.add(put)
    assert len(answers) == 1, answers
    status, raw = answers.pop()
    assert (status, json.loads(raw)["message"]) == (502, "cannot reach the cluster's apiserver"), raw


def test_the_dry_run_review_tells_the_cause_to_superusers_only() -> None:
    """The review endpoint's answer lists each webhook's step; a failed call's cause is a superuser's."""
    configuration = _configuration(f"https://{HOST}:{free_port(HOST)}/", trustme.CA().cert_pem.bytes().decode())
    configuration["webhooks"][0]["timeoutSeconds"] = 1
    configuration["webhooks"][0]["failurePolicy"] = "Ignore"
    engine = AdmissionEngine(MemoryDefinitionStore(k8s={CLUSTER: [parse_k8s_configuration(configuration)]}),
                             client=WebhookClient())
    document = {"operation": "CREATE", "cluster_id": CLUSTER, "resource": "pods", "object": _pod("r1")}
    steps = {}
    for user in (env.User(1, "root", is_superuser=True), env.User(2, "mallory")):
        started = time.monotonic()
        answer = review(engine, document, user)
        steps[user.name] = (answer["allowed"], answer["webhooks"], time.monotonic() - started)
    assert steps["root"][0] is True and steps["root"][1][0]["cause"] == "connect", steps
    assert steps["root"][2] < 1
    assert steps["mallory"][0] is True and steps["mallory"][2] >= 1, steps
    assert {k: steps["mallory"][1][0][k] for k in ("outcome", "cause", "detail")} == {
        "outcome": "skipped", "cause": "failed", "detail": PUBLIC_FAILURE}
