"""The standalone admission filter (``examples/admission_app.ini``) as shipped, in a real gunicorn.

An application behind the filter may parse a body whatever its ``Content-Type`` says (``curl -d``
sends ``application/x-www-form-urlencoded``): a body a definition could match is admitted or
refused, never passed on unjudged. The definitions are ``examples/admission-definitions.yaml``
(Create of Deployments → the example sidecar injector), the app ``examples/hello_app.py``, which
echoes the body it got.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import trustme
import yaml

from tests.support.servers import ServerProcess, gunicorn

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DEPLOYMENT = {"apiVersion": "v4", "kind": "deployment", "metadata": {"name": "web", "namespace": "prod"},
              "spec": {"template": {"spec": {"containers": [{"name": "app", "image": "nginx"}]}}}}
WEBHOOK = "inject-sidecar/container-sidecar"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    import sidecar_injector
    from webhook_kit import https_server

    tmp = tmp_path_factory.mktemp("standalone")
    ca = trustme.CA()
    # the certificate `bcs-middleware certs --service sidecar-injector --namespace bcs-system` makes
    cert = ca.issue_cert("sidecar-injector.bcs-system", "sidecar-injector.bcs-system.svc")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp / "hook.pem"))
    hook = https_server(sidecar_injector.app, str(tmp / "hook.pem"), str(tmp / "hook.pem"), port=0)
    threading.Thread(target=hook.serve_forever, args=(0.05,), daemon=True).start()
    definitions = tmp / "definitions.yaml"
    definitions.write_text((EXAMPLES / "admission-definitions.yaml").read_text().replace(
        "PASTE_THE_caBundle_PRINTED_BY_bcs-middleware_certs", base64.b64encode(ca.cert_pem.bytes()).decode()))
    ini = tmp / "admission_app.ini"
    ini.write_text((EXAMPLES / "admission_app.ini").read_text().replace("127.0.0.1:9443",
                                                                        f"127.0.0.1:{hook.server_port}"))
    with gunicorn(str(ini), workers=1, extra=["--pythonpath", str(EXAMPLES),
                                              "--paste-global", f"definitions_file={definitions}"]) as server:
        yield server
    hook.shutdown()
    hook.server_close()


def post(server: ServerProcess, data: bytes, content_type: str | None, method: str = "POST") -> requests.Response:
    headers = {"Content-Type": content_type} if content_type is not None else {}  # requests adds none for bytes
    return requests.request(method, f"{server.url}/v4/deployments", data=data, headers=headers, timeout=30)


def _containers(answer: dict[str, Any]) -> list[str]:
    return [c["name"] for c in answer["body"]["spec"]["template"]["spec"]["containers"]]


@pytest.mark.parametrize("content_type", [
    pytest.param("application/x-www-form-urlencoded", id="curl-d"),
    pytest.param("text/plain", id="text"),
    pytest.param("multipart/form-data; boundary=x", id="multipart"),
    pytest.param("application/octet-stream", id="octets"),
])
def test_a_body_of_another_media_type_is_refused_naming_the_webhook(served: ServerProcess, content_type: str) -> None:
    response = post(served, json.dumps(DEPLOYMENT).encode(), content_type)
    assert response.status_code == 415, response.text
    answer = response.json()
    assert WEBHOOK in answer["message"] and "hello" not in answer  # the app never saw it


def test_a_body_without_a_content_type_is_admitted_as_json(served: ServerProcess) -> None:
    response = post(served, json.dumps(DEPLOYMENT).encode(), None)
    assert response.status_code == 200, response.text
    assert _containers(response.json()) == ["app", "sidecar"]


def test_a_yaml_body_is_admitted_and_reaches_the_app_as_json(served: ServerProcess) -> None:
    response = post(served, yaml.safe_dump(DEPLOYMENT).encode(), "application/yaml")
    assert response.status_code == 200, response.text
    assert _containers(response.json()) == ["app", "sidecar"]


@pytest.mark.parametrize(("data", "content_type", "code"), [
    pytest.param(b'{"apiVersion": "v4", "kind": "deployment", "kind": "application"}', "application/json",
                 "DUPLICATE_FIELD", id="duplicate-key"),
    pytest.param(b'{"apiVersion": "v4", "kind": "deployment", ', "application/json", "INVALID_JSON",
                 id="not-json"),
    pytest.param(b"kind: deployment\nkind: application\n", "application/yaml", "DUPLICATE_FIELD",
                 id="duplicate-yaml-key"),
])
def test_a_body_the_filter_cannot_read_as_one_document_is_refused(served: ServerProcess, data: bytes,
                                                                  content_type: str, code: str) -> None:
    response = post(served, data, content_type)
    assert response.status_code == 400 and response.json()["code_name"] == code, response.text


def test_what_no_definition_can_match_reaches_the_app_as_sent(served: ServerProcess) -> None:
    # no body at all, and an Update (the definitions cover Create only): nothing to judge
    empty = post(served, b"", "application/x-www-form-urlencoded")
    assert empty.status_code == 200 and empty.json()["body"] is None
    update = post(served, b"a=1&b=2", "application/x-www-form-urlencoded", method="PUT")
    assert update.status_code == 200 and update.json()["body"] == "a=1&b=2"
