"""An exception no layer meant is answered in the route's error style, never the server's HTML page.

Through a real server: ``tests/compose/test_many_instances.py`` (a stored credential no key decrypts makes the
tunnel answer a Kubernetes ``Status``). Here, every route style of both compositions' edges.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from werkzeug.test import Client

from bcs_middleware.compose.driver import build_driver
from bcs_middleware.discovery.static import StaticDiscovery
from bcs_middleware.layers.request_context import RequestContextMiddleware


def _exploding(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    raise RuntimeError("a bug with a secret-looking detail: s3cr3t")


@pytest.mark.parametrize(
    ("path", "style"),
    [
        pytest.param("/tunnels/clusters/BCS-K8S-1/api/v1/pods", "kubernetes", id="tunnel"),
        pytest.param("/bcsapi/v4/scheduler/mesos/namespaces/ns/applications", "bcs", id="mesos"),
        pytest.param("/rest/clusters/c1", "json", id="rest"),
    ],
)
def test_the_gateway_edge_answers_an_unexpected_error_in_the_route_style(
    path: str, style: str, caplog: pytest.LogCaptureFixture,
) -> None:
    client = Client(RequestContextMiddleware(_exploding, access_log=False))
    with caplog.at_level(logging.ERROR, logger="bcs_middleware.core.errors"):
        response = client.get(path)
    assert response.status_code == 500
    assert response.headers["Content-Type"] == "application/json"
    body = json.loads(response.get_data())
    if style == "kubernetes":
        assert body["kind"] == "Status" and body["code"] == 500 and body["reason"] == "InternalError"
    elif style == "bcs":
        assert body["result"] is False and isinstance(body["code"], int)
    else:
        assert body["code_name"] == "INTERNAL_ERROR"
    assert "s3cr3t" not in response.get_data(as_text=True)  # the detail is the operator's, in the log
    assert any(record.exc_info for record in caplog.records)


def test_an_error_after_the_answer_began_is_left_to_the_server() -> None:
    def begins_then_fails(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        raise RuntimeError("too late to answer anything else")

    with pytest.raises(RuntimeError, match="too late"):
        Client(RequestContextMiddleware(begins_then_fails)).get("/rest/x")


class _BrokenDiscovery(StaticDiscovery):
    def scheduler_master(self) -> Any:
        raise RuntimeError("discovery bug")


def test_the_driver_edge_answers_an_unexpected_error_in_the_bcs_envelope() -> None:
    app = build_driver(cluster_id="BCS-MESOS-1", discovery=_BrokenDiscovery())
    response = Client(app).get("/mesosdriver/v4/namespaces/ns/applications",
                               headers={"BCS-ClusterID": "BCS-MESOS-1"})
    assert response.status_code == 500
    body = json.loads(response.get_data())
    assert body["result"] is False and body["data"] is None
    # The driver's health route is plain JSON.
    response = Client(app).get("/readyz")
    assert response.status_code == 500 and json.loads(response.get_data())["code_name"] == "INTERNAL_ERROR"
