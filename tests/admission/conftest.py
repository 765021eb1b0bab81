"""Real HTTPS webhook servers with trustme certificates, and helpers to build definitions."""

from __future__ import annotations

import base64
import json
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from werkzeug.serving import make_server

from bcs_middleware.admission.client import CircuitBreaker, WebhookClient
from bcs_middleware.admission.store import MemoryDefinitionStore

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "webhooks"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

SERVICE_NAMES = [f"hook-{c}.webhooks" for c in "abcdef"]
Behaviour = Callable[[dict[str, Any]], Any]


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="session")
def other_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="session")
def server_cert(ca: trustme.CA) -> trustme.LeafCert:
    return ca.issue_cert(*SERVICE_NAMES, "127.0.0.1", "localhost")


def ca_bundle(ca: trustme.CA) -> str:
    return base64.b64encode(ca.cert_pem.bytes()).decode()


class Hook:
    """One HTTPS webhook on 127.0.0.1; ``behaviour(body)`` returns the answer.

    The answer is an object (sent as JSON), ``bytes`` (sent raw), or a tuple
    ``(status, object_or_bytes)``. ``calls`` counts requests; ``bodies`` keeps them.
    """

    def __init__(self, cert: trustme.LeafCert, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.calls = 0
        self.bodies: list[dict[str, Any]] = []
        self.delay = 0.0
        self._stopped = False
        self._lock = threading.Lock()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(context)
        self.server = make_server("127.0.0.1", 0, self._app, threaded=True, ssl_context=context)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,),
                                       daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _app(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        body = json.loads(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
        with self._lock:
            self.calls += 1
            self.bodies.append(json.loads(json.dumps(body)))
        if self.delay:
            time.sleep(self.delay)
        answer = self.behaviour(body)
        status = 200
        if isinstance(answer, tuple):
            status, answer = answer
        payload = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        start_response(f"{status} X", [("Content-Type", "application/json"),
                                       ("Content-Length", str(len(payload)))])
        return [payload]

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hooks(server_cert: trustme.LeafCert) -> Iterator[Callable[[Behaviour], Hook]]:
    started: list[Hook] = []

    def start(behaviour: Behaviour) -> Hook:
        hook = Hook(server_cert, behaviour)
        started.append(hook)
        return hook

    yield start
    for hook in started:
        hook.stop()


# -- behaviours ------------------------------------------------------------------------------

def bcs_add_label(key: str, value: str) -> Behaviour:
    """bcs protocol: answer the object with one more label."""

    def behaviour(obj: dict[str, Any]) -> Any:
        obj.setdefault("metadata", {}).setdefault("labels", {})[key] = value
        return obj

    return behaviour


def review_answer(body: dict[str, Any], *, allowed: bool = True, patch: list[Any] | None = None,
                  **extra: Any) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": body["request"]["uid"], "allowed": allowed, **extra}
    if patch is not None:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def k8s_add_label(key: str, value: str, **extra: Any) -> Behaviour:
    """Kubernetes protocol: allow with a JSON patch adding one label."""

    def behaviour(body: dict[str, Any]) -> Any:
        obj = body["request"]["object"]
        ops: list[dict[str, Any]] = []
        if "labels" not in obj.get("metadata", {}):
            ops.append({"op": "add", "path": "/metadata/labels", "value": {}})
        ops.append({"op": "add", "path": f"/metadata/labels/{key}", "value": value})
        return review_answer(body, patch=ops, **extra)

    return behaviour


def k8s_allow(body: dict[str, Any]) -> Any:
    return review_answer(body)


# -- definitions ------------------------------------------------------------------------------

def bcs_webhook(service: str, ca: trustme.CA, *, policy: str = "Fail", path: str = "/",
                **extra: Any) -> dict[str, Any]:
    name, namespace = service.split(".")
    return {"name": f"{name}-hook", "failurePolicy": policy,
            "clientConfig": {"caBundle": ca_bundle(ca), "name": name, "namespace": namespace,
                             "path": path, "port": 443},
            **extra}


def bcs_definition(name: str, webhooks: list[dict[str, Any]], *, operation: str = "Create",
                   kind: str = "Application") -> dict[str, Any]:
    return {"apiVersion": "v4", "kind": "admissionwebhook", "metadata": {"name": name},
            "resourcesRef": {"operation": operation, "kind": kind},
            "admissionWebhooks": webhooks}


def k8s_webhook(name: str, service: str, ca: trustme.CA, *, policy: str = "Fail",
                resources: tuple[str, ...] = ("pods",), operations: tuple[str, ...] = ("CREATE",),
                **extra: Any) -> dict[str, Any]:
    svc, namespace = service.split(".")
    return {
        "name": name,
        "clientConfig": {"caBundle": ca_bundle(ca),
                         "service": {"name": svc, "namespace": namespace, "path": "/", "port": 443}},
        "rules": [{"operations": list(operations), "apiGroups": ["", "apps"],
                   "apiVersions": ["v1"], "resources": list(resources)}],
        "failurePolicy": policy,
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        **extra,
    }


def k8s_configuration(name: str, webhooks: list[dict[str, Any]], *,
                      mutating: bool = True) -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration" if mutating else "ValidatingWebhookConfiguration",
            "metadata": {"name": name}, "webhooks": webhooks}


def client_for(*pairs: tuple[str, Hook], threshold: int = 5, cooldown: float = 30.0) -> WebhookClient:
    return WebhookClient(address_map={svc: hook.address for svc, hook in pairs},
                         breaker=CircuitBreaker(threshold, cooldown))


def empty_store() -> MemoryDefinitionStore:
    return MemoryDefinitionStore()
