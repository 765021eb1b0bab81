"""``BCS-API-Tunnel-Params`` as bcs-kube-agent builds it (``bcs-kube-agent/app/websocket.go``).

The Go agent marshals ``{"address": "https://<KUBERNETES_SERVICE_HOST>:<PORT>", "userToken":
<bearer token>, "caCert": base64(<CA PEM>)}`` and sends ``base64.StdEncoding`` of that JSON;
bcs-cluster-manager's tunnel server decodes both layers of base64.
"""

from __future__ import annotations

import base64
import json

import pytest
import trustme

from bcs_middleware.agent_tunnel.handshake import TunnelParams
from bcs_middleware.core.errors import BadRequest
from bcs_middleware.layers.agent_endpoint import parse_params, request_head

CA_PEM = trustme.CA().cert_pem.bytes().decode()


def _go_agent_params(address: str, token: str, ca_pem: str) -> str:
    # json.Marshal of a map sorts the keys; the values are as the agent fills them.
    body = json.dumps({"address": address, "caCert": base64.b64encode(ca_pem.encode()).decode(),
                       "userToken": token}, separators=(",", ":"))
    return base64.b64encode(body.encode()).decode()


def test_the_go_agents_params_are_read() -> None:
    params = _go_agent_params("https://10.96.0.1:443", "eyJhbGciOiJSUzI1NiJ9.e30.sig", CA_PEM)
    assert parse_params(params) == TunnelParams("https://10.96.0.1:443", "eyJhbGciOiJSUzI1NiJ9.e30.sig", CA_PEM)


@pytest.mark.parametrize("token", ["", "has space", "new\nline", "x" * (16 * 1024 + 1)])
def test_unusable_user_tokens_are_refused(token: str) -> None:
    with pytest.raises(BadRequest) as refused:
        parse_params(_go_agent_params("https://10.96.0.1:443", token, CA_PEM))
    assert "userToken" in refused.value.message
    assert token not in refused.value.message or not token


def test_the_request_head_is_rebuilt_for_the_handshake() -> None:
    head = request_head({"REQUEST_METHOD": "GET", "RAW_URI": "/bcsapi/v1/websocket/connect",
                         "HTTP_HOST": "gw:8443", "HTTP_SEC_WEBSOCKET_KEY": "abc==", "HTTP_UPGRADE": "websocket",
                         "wsgi.input": object()})
    assert head.startswith(b"GET /bcsapi/v1/websocket/connect HTTP/1.1\r\n")
    assert b"Host: gw:8443\r\n" in head and b"Sec-Websocket-Key: abc==\r\n" in head
    assert head.endswith(b"\r\n\r\n")


@pytest.mark.parametrize(("reported", "stored"), [
    ("https://fd00::1:443", "https://[fd00::1]:443"),  # the Go agent's unbracketed IPv6
    ("https://[fd00::1]:6443/", "https://[fd00::1]:6443"),
    ("https://Kube.Example:443", "https://kube.example:443"),
    ("https://10.96.0.1", "https://10.96.0.1:443"),
])
def test_the_reported_address_is_stored_in_one_canonical_form(reported: str, stored: str) -> None:
    """Every reader of server_addresses parses them as URLs: an unbracketed IPv6 would not parse."""
    from urllib.parse import urlsplit

    params = parse_params(_go_agent_params(reported, "token", CA_PEM))
    assert params.address == stored
    assert urlsplit(params.address).port is not None
