"""Real HTTPS admission webhooks for tests: a WSGI app on loopback with a trustme certificate.

``served_webhook(app)`` serves ``app`` on 127.0.0.1 (threaded, TLS) with a certificate for
``names`` signed by a fresh CA, and gives its port and the ``caBundle`` (base64 PEM) a definition
names it with. ``allow_review`` is a validating webhook that allows everything, reading no more
of the review than its ``uid`` (so a large object costs the test process nothing).
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trustme
from werkzeug.serving import BaseWSGIServer, make_server

_UID = re.compile(rb'"uid":\s*"([^"]+)"')


@dataclass
class ServedWebhook:
    port: int
    ca: trustme.CA
    server: BaseWSGIServer

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.ca.cert_pem.bytes()).decode()


@contextmanager
def served_webhook(app: Callable[..., Iterable[bytes]], *,
                   names: Sequence[str] = ("localhost",)) -> Iterator[ServedWebhook]:
    ca = trustme.CA()
    with tempfile.TemporaryDirectory(prefix="webhook-") as tmp:
        pem = Path(tmp) / "hook.pem"
        ca.issue_cert(*names).private_key_and_cert_chain_pem.write_to_path(str(pem))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(pem))
    server = make_server("127.0.0.1", 0, app, threaded=True, ssl_context=context)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield ServedWebhook(server.server_port, ca, server)
    finally:
        server.shutdown()
        server.server_close()


def allow_review(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """An ``admission.k8s.io/v1`` webhook allowing every request."""
    stream, left, uid = environ["wsgi.input"], int(environ.get("CONTENT_LENGTH") or 0), None
    while left > 0:
        piece = stream.read(min(left, 1 << 16))
        if not piece:
            break
        left -= len(piece)
        found = _UID.search(piece) if uid is None else None
        if found:
            uid = found.group(1).decode()
    answer = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "response": {"uid": uid, "allowed": True}}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(answer)))])
    return [answer]


def allow_configmaps(webhook: ServedWebhook, name: str = "allow") -> dict[str, Any]:
    """A ValidatingWebhookConfiguration sending every configmap create to ``webhook`` (at ``localhost``)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{"name": f"{name}.example.com", "failurePolicy": "Fail", "sideEffects": "None",
                      "admissionReviewVersions": ["v1"], "timeoutSeconds": 30,
                      "clientConfig": {"url": f"https://localhost:{webhook.port}/", "caBundle": webhook.ca_bundle},
                      "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                 "resources": ["configmaps"]}]}],
    }
