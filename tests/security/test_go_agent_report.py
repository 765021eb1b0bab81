"""The Go bcs-kube-agent's report, byte for byte as it sends it, through a real ``bcs-middleware serve``.

The fixture is written from the source (TencentBlueKing/bk-bcs, ``bcs-k8s/bcs-kube-agent/app/report.go``):
``gorequest.New().TLSClientConfig(...).Put(bkeUrl).Send(clusterInfoParams).End()`` with

    type ClusterInfoParams struct {
        RegisterToken   string `json:"register_token"`
        ServerAddresses string `json:"server_addresses"`
        CaCertData      string `json:"cacert_data"`
        UserToken       string `json:"user_token"`
    }

and ``bkeUrl = fmt.Sprintf("%s/rest/clusters/%s/credentials", bkeServerAddress, clusterId)``: no
``Authorization`` header. gorequest turns the struct into a map and marshals that (keys sorted), sets
``Content-Type: application/json``; Go's client adds ``User-Agent: Go-http-client/1.1`` and
``Accept-Encoding: gzip``. bcs-api answered a missing token ``RTOKEN_NOT_FOUND`` and a wrong one
``INVALID_RTOKEN``, both HTTP 400 (``WriteClientError``), which the agent logs by ``code_name``.
"""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gateway import Gateway, served_gateway

CLUSTER = "BCS-K8S-GO01"
OTHER = "BCS-K8S-GO02"
APISERVER = "https://10.0.7.1:6443;https://10.0.7.2:6443"
SA_TOKEN = "go-agent-service-account-token-" + "s" * 16


def go_agent_request(host: str, cluster_id: str, fields: dict[str, str], *, path: str | None = None) -> bytes:
    """The HTTP/1.1 request Go's net/http writes for the agent's PUT (header order as Go writes it)."""
    body = json.dumps(dict(sorted(fields.items())), separators=(",", ":")).encode()
    target = path or f"/rest/clusters/{cluster_id}/credentials"
    head = (
        f"PUT {target} HTTP/1.1\r\n"
        f"Host: {host}\r\n"
        "User-Agent: Go-http-client/1.1\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Content-Type: application/json\r\n"
        "Accept-Encoding: gzip\r\n"
        "\r\n"
    )
    return head.encode() + body


def send_raw(gw: Gateway, raw: bytes) -> tuple[int, dict]:
    ctx = ssl.create_default_context(cafile=gw.ca_file)
    with socket.create_connection(("127.0.0.1", gw.server.port), timeout=20) as sock, \
            ctx.wrap_socket(sock, server_hostname="localhost") as tls:
        tls.sendall(raw)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = tls.recv(65536)
            assert chunk, data
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(rest) < length:
            chunk = tls.recv(65536)
            assert chunk
            rest += chunk
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(rest[:length])


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with served_gateway(tmp_path_factory.mktemp("go-agent")) as gateway:
        for cluster in (CLUSTER, OTHER):
            gateway.json("POST", "/rest/clusters/bcs", body={"id": cluster, "project_id": "p", "cluster_type": "k8s"})
        yield gateway


def _fields(gw: Gateway, token: str) -> dict[str, str]:
    return {"register_token": token, "server_addresses": APISERVER,
            "cacert_data": Path(gw.ca_file).read_text(), "user_token": SA_TOKEN}


def _register_token(gw: Gateway, cluster: str) -> str:
    status, body = gw.call("GET", f"/rest/clusters/{cluster}/register_tokens")
    if status == 200:
        return str(json.loads(body)["token"])
    return str(gw.json("POST", f"/rest/clusters/{cluster}/register_tokens")["token"])


def test_the_go_agent_report_is_accepted_without_authorization(gw: Gateway) -> None:
    token = _register_token(gw, CLUSTER)
    status, body = send_raw(gw, go_agent_request(f"localhost:{gw.server.port}", CLUSTER, _fields(gw, token)))
    assert status == 200, body
    assert body["server_addresses"] == APISERVER
    report = gw.json("GET", f"/rest/clusters/{CLUSTER}/credentials")
    assert report["reported"] and report["server_addresses"] == APISERVER.split(";")
    assert report["has_token"] and report["has_ca"] and SA_TOKEN not in json.dumps(report)


def test_the_report_also_works_at_the_seed_path(gw: Gateway) -> None:
    token = _register_token(gw, CLUSTER)
    raw = go_agent_request(f"localhost:{gw.server.port}", CLUSTER, _fields(gw, token),
                           path=f"/clusters/{CLUSTER}/credentials")
    assert send_raw(gw, raw)[0] == 200


def test_a_wrong_register_token_is_invalid_rtoken_and_changes_nothing(gw: Gateway) -> None:
    _register_token(gw, CLUSTER)
    before = gw.json("GET", f"/rest/clusters/{CLUSTER}/credentials")
    fields = {**_fields(gw, "x" * 43), "server_addresses": "https://10.9.9.9:6443"}
    status, body = send_raw(gw, go_agent_request(f"localhost:{gw.server.port}", CLUSTER, fields))
    assert (status, body["code_name"]) == (400, "INVALID_RTOKEN")
    assert gw.json("GET", f"/rest/clusters/{CLUSTER}/credentials")["server_addresses"] == before["server_addresses"]


def test_another_clusters_register_token_is_invalid_rtoken(gw: Gateway) -> None:
    other_token = _register_token(gw, OTHER)
    _register_token(gw, CLUSTER)
    status, body = send_raw(gw, go_agent_request(f"localhost:{gw.server.port}", CLUSTER,
                                                 _fields(gw, other_token)))
    assert (status, body["code_name"]) == (400, "INVALID_RTOKEN")


def test_a_cluster_without_register_token_is_rtoken_not_found(gw: Gateway) -> None:
    token = _register_token(gw, OTHER)
    gw.json("DELETE", f"/rest/clusters/{OTHER}/register_tokens")  # revoked: the old one is no key any more
    status, body = send_raw(gw, go_agent_request(f"localhost:{gw.server.port}", OTHER, _fields(gw, token)))
    assert (status, body["code_name"]) == (400, "RTOKEN_NOT_FOUND")
    # an unknown cluster answers the same: nothing tells the two apart
    status, body = send_raw(gw, go_agent_request(f"localhost:{gw.server.port}", "BCS-K8S-NONE",
                                                 _fields(gw, token)))
    assert (status, body["code_name"]) == (400, "RTOKEN_NOT_FOUND")


def test_no_token_anywhere_is_401_and_other_routes_stay_closed(gw: Gateway) -> None:
    fields = {k: v for k, v in _fields(gw, "").items() if k != "register_token"}
    status, body = send_raw(gw, go_agent_request(f"localhost:{gw.server.port}", CLUSTER, fields))
    assert status == 401, body
    # only the report's PUT passes the auth layer without a token
    assert gw.call("GET", f"/rest/clusters/{CLUSTER}/credentials", token="")[0] == 401
    assert gw.call("PUT", f"/rest/clusters/{CLUSTER}/permissions/x", token="", body={"permission": "edit"})[0] == 401


def test_the_bearer_form_still_works_and_a_wrong_body_token_spoils_it(gw: Gateway) -> None:
    token = _register_token(gw, CLUSTER)
    fields = {k: v for k, v in _fields(gw, token).items() if k != "register_token"}
    status, body = gw.call("PUT", f"/rest/clusters/{CLUSTER}/credentials", token=token, body=fields)
    assert status == 200, body
    status, body = gw.call("PUT", f"/rest/clusters/{CLUSTER}/credentials", token=token,
                           body={**fields, "register_token": "y" * 43})
    assert (status, json.loads(body)["code_name"]) == (400, "INVALID_RTOKEN")


def test_register_tokens_never_reach_the_log(gw: Gateway) -> None:
    token = _register_token(gw, CLUSTER)
    send_raw(gw, go_agent_request(f"localhost:{gw.server.port}", CLUSTER, _fields(gw, token)))
    assert token not in gw.server.output()


@pytest.mark.parametrize("method, path", [
    pytest.param("PUT", f"/rest/clusters/{CLUSTER}/credentials/more", id="below"),
    pytest.param("PUT", f"/rest/clusters/{CLUSTER}/credentialsx", id="longer-name"),
    pytest.param("PUT", f"/rest/clusters/{CLUSTER}//credentials", id="doubled-slash"),
    pytest.param("PUT", f"/rest//clusters/{CLUSTER}/credentials", id="doubled-slash-early"),
    pytest.param("PUT", f"//rest/clusters/{CLUSTER}/credentials", id="leading-doubled-slash"),
    pytest.param("PUT", f"/rest/clusters/{CLUSTER}/credentials//", id="two-trailing-slashes"),
    pytest.param("PUT", f"/tunnels/clusters/{CLUSTER}/rest/clusters/{CLUSTER}/credentials", id="under-tunnel"),
    pytest.param("POST", f"/rest/clusters/{CLUSTER}/credentials", id="post"),
    pytest.param("DELETE", f"/clusters/{CLUSTER}/credentials", id="delete-legacy"),
])
def test_only_the_report_route_itself_passes_without_a_token(gw: Gateway, method: str, path: str) -> None:
    """The route table names the report; a path near it, or another method, needs a token."""
    status, body = gw.call(method, path, token="", body={"register_token": "x" * 43})
    assert status == 401, body
    assert b"bearer token" in body
