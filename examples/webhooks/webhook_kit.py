"""What both example injectors share: one WSGI app speaking both admission protocols.

* **bcs** (the mesos-driver protocol): the request body is the object
  (Application, Deployment); the answer is the whole modified object.
* **Kubernetes** (``admission.k8s.io/v1 AdmissionReview``): the answer is an
  AdmissionReview with the same ``uid``, ``allowed: true`` and a base64 JSON Patch
  computed with ``jsonpatch.make_patch`` from the same mutation.

A mutation is a function ``mutate(obj) -> None`` changing ``obj`` in place.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import json
import socket
import ssl
from collections.abc import Callable, Iterable
from typing import Any

import jsonpatch
from werkzeug.serving import BaseWSGIServer, make_server

Mutation = Callable[[dict[str, Any]], None]
MAX_BODY = 3 * 1024 * 1024


def is_bcs(obj: dict[str, Any]) -> bool:
    """A bcs v4 object (a Mesos Application, Deployment…): its containers have bcs shapes."""
    return obj.get("apiVersion") == "v4"


def pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The pod spec of a Pod, of a workload template, or of a bcs Application/Deployment."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return None
    template = spec.get("template")
    if isinstance(template, dict) and isinstance(template.get("spec"), dict):
        return template["spec"]
    return spec if "containers" in spec else None


def pod_annotations(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    template = spec.get("template") if isinstance(spec.get("template"), dict) else None
    meta = (template if template is not None else obj).setdefault("metadata", {})
    return meta.setdefault("annotations", {})


def admission_app(mutate: Mutation) -> Callable[..., Iterable[bytes]]:
    """A WSGI app answering both protocols on every path."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"] != "POST":
            return _send(start_response, "405 Method Not Allowed", {"message": "POST only"})
        length = int(environ.get("CONTENT_LENGTH") or 0)
        if length > MAX_BODY:
            return _send(start_response, "413 Payload Too Large", {"message": "too large"})
        try:
            body = json.loads(environ["wsgi.input"].read(length))
        except ValueError:
            return _send(start_response, "400 Bad Request", {"message": "body is not JSON"})
        if not isinstance(body, dict):
            return _send(start_response, "400 Bad Request", {"message": "body is not an object"})
        if body.get("kind") == "AdmissionReview" and isinstance(body.get("request"), dict):
            return _send(start_response, "200 OK", review(body, mutate))
        mutated = copy.deepcopy(body)
        mutate(mutated)
        return _send(start_response, "200 OK", mutated)

    return app


def review(body: dict[str, Any], mutate: Mutation) -> dict[str, Any]:
    request = body["request"]
    response: dict[str, Any] = {"uid": request.get("uid"), "allowed": True}
    obj = request.get("object")
    if isinstance(obj, dict):
        mutated = copy.deepcopy(obj)
        mutate(mutated)
        patch = jsonpatch.make_patch(obj, mutated).patch
        if patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": body.get("apiVersion", "admission.k8s.io/v1"), "kind": "AdmissionReview",
            "response": response}


def _send(start_response: Callable[..., Any], status: str, data: Any) -> list[bytes]:
    payload = json.dumps(data).encode()
    start_response(status, [("Content-Type", "application/json"),
                            ("Content-Length", str(len(payload)))])
    return [payload]


def https_server(app: Callable[..., Iterable[bytes]], certfile: str, keyfile: str,
                 host: str = "127.0.0.1", port: int = 8443) -> BaseWSGIServer:
    """A threaded HTTPS server for ``app`` (``serve_forever()`` / ``shutdown()``)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile, keyfile)
    server = make_server(host, port, app, threaded=True, ssl_context=context)
    # Accepted sockets inherit this: without it, headers and body written separately
    # meet the client's delayed ACK and every answer waits ~40 ms.
    server.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return server


def main(mutate: Mutation, description: str) -> None:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--tls-cert-file", required=True,
                        help="server certificate (bcs-middleware certs --service ... writes it)")
    parser.add_argument("--tls-key-file", required=True)
    args = parser.parse_args()
    server = https_server(admission_app(mutate), args.tls_cert_file, args.tls_key_file,
                          args.host, args.port)
    print(f"serving on https://{args.host}:{args.port}/", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
