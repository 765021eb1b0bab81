from __future__ import annotations

import json

import pytest
import trustme

CA_PEM = trustme.CA().cert_pem.bytes().decode()


def _cluster(api, cluster_id: str = "BCS-K8S-001", token=None) -> None:  # type: ignore[no-untyped-def]
    kwargs = {"token": token} if token else {}
    response = api.call("POST", "/rest/clusters/bcs",
                        json={"id": cluster_id, "project_id": "proj1", "cluster_type": "k8s"}, **kwargs)
    assert response.status_code == 201, response.get_json()


def _register(api, cluster_id: str = "BCS-K8S-001") -> str:  # type: ignore[no-untyped-def]
    response = api.call("POST", f"/rest/clusters/{cluster_id}/register_tokens")
    assert response.status_code == 201
    token = response.get_json()["token"]
    api.tokens.append(token)
    return token


def _credentials(**overrides: str) -> dict[str, str]:
    body = {
        "server_addresses": "https://10.0.0.1:6443;https://10.0.0.2:6443",
        "cacert_data": CA_PEM,
        "user_token": "sa-token-abcdefghijklmnopqrstuvwxyz",
    }
    body.update(overrides)
    return body


def test_user_registers_and_reads_a_cluster(api) -> None:  # type: ignore[no-untyped-def]
    _, token = api.new_user("ops")
    _cluster(api, token=token)
    body = api.call("GET", "/rest/clusters/BCS-K8S-001", token=token).get_json()
    assert body["id"] == "BCS-K8S-001" and body["cluster_type"] == "k8s" and body["project_id"] == "proj1"


def test_duplicate_cluster_is_a_conflict(api) -> None:  # type: ignore[no-untyped-def]
    _cluster(api)
    again = api.call("POST", "/rest/clusters/bcs", json={"id": "BCS-K8S-001", "project_id": "p", "cluster_type": "k8s"})
    assert again.status_code == 409 and again.get_json()["code_name"] == "CLUSTER_EXISTS"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param({"project_id": "p", "cluster_type": "k8s"}, "id", id="missing-id"),
        pytest.param({"id": "c", "project_id": "p", "cluster_type": "swarm"}, "cluster_type", id="bad-type"),
        pytest.param({"id": 7, "project_id": "p", "cluster_type": "k8s"}, "id", id="wrong-type"),
        pytest.param({"id": "../x", "project_id": "p", "cluster_type": "k8s"}, "id", id="bad-chars"),
        pytest.param({"id": "c", "project_id": "p", "cluster_type": "k8s", "x": 1}, "x", id="unknown-field"),
    ],
)
def test_bad_cluster_bodies_are_400(api, body, field) -> None:  # type: ignore[no-untyped-def]
    response = api.call("POST", "/rest/clusters/bcs", json=body)
    assert response.status_code == 400
    assert field in response.get_json()["message"]
    assert api.store.find_cluster("c") is None


def test_malformed_json_is_400(api) -> None:  # type: ignore[no-untyped-def]
    response = api.call("POST", "/rest/clusters/bcs", data=b"{not json", content_type="application/json")
    assert response.status_code == 400 and response.get_json()["code_name"] == "INVALID_JSON"


def test_oversized_body_is_413_sized_and_chunked(api) -> None:  # type: ignore[no-untyped-def]
    big = json.dumps({"id": "c", "project_id": "p" * 70_000, "cluster_type": "k8s"}).encode()
    sized = api.call("POST", "/rest/clusters/bcs", data=big, content_type="application/json")
    assert sized.status_code == 413 and sized.get_json()["code_name"] == "PAYLOAD_TOO_LARGE"

    def chunks():  # type: ignore[no-untyped-def]
        for i in range(0, len(big), 4096):
            yield big[i:i + 4096]

    from io import BytesIO

    chunked = api.call("POST", "/rest/clusters/bcs", input_stream=BytesIO(big),
                       headers={"Transfer-Encoding": "chunked"}, content_type="application/json",
                       environ_overrides={"wsgi.input_terminated": True})
    assert chunked.status_code == 413
    assert api.store.find_cluster("c") is None


def test_register_token_is_created_once_and_read_back(api) -> None:  # type: ignore[no-untyped-def]
    _cluster(api)
    token = _register(api)
    assert len(token) == 43
    assert api.call("POST", "/rest/clusters/BCS-K8S-001/register_tokens").status_code == 409
    read = api.call("GET", "/rest/clusters/BCS-K8S-001/register_tokens")
    assert read.status_code == 200 and read.get_json()["token"] == token
    # Encrypted at rest: the value is nowhere in the table.
    with api.store.db.engine.connect() as conn:
        dump = "\n".join(str(r) for r in conn.exec_driver_sql("SELECT * FROM register_tokens"))
    assert token not in dump


def test_register_token_for_unknown_cluster_is_404(api) -> None:  # type: ignore[no-untyped-def]
    assert api.call("POST", "/rest/clusters/nope/register_tokens").status_code == 404
    assert api.call("GET", "/rest/clusters/nope/register_tokens").status_code == 404


@pytest.mark.parametrize("prefix", ["/rest/clusters", "/clusters"])
def test_register_token_reports_credentials(api, prefix) -> None:  # type: ignore[no-untyped-def]
    _cluster(api)
    token = _register(api)
    response = api.call("PUT", f"{prefix}/BCS-K8S-001/credentials", token=token, json=_credentials())
    assert response.status_code == 200, response.get_json()
    creds = api.store.get_credentials("BCS-K8S-001")
    assert creds.server_addresses == ("https://10.0.0.1:6443", "https://10.0.0.2:6443")
    assert creds.user_token == "sa-token-abcdefghijklmnopqrstuvwxyz"
    with api.store.db.engine.connect() as conn:
        dump = "\n".join(str(r) for r in conn.exec_driver_sql("SELECT * FROM cluster_credentials"))
    assert "sa-token" not in dump and "10.0.0.1" not in dump


def test_register_token_of_another_cluster_is_403(api) -> None:  # type: ignore[no-untyped-def]
    _cluster(api, "c-one")
    _cluster(api, "c-two")
    token_one = _register(api, "c-one")
    response = api.call("PUT", "/rest/clusters/c-two/credentials", token=token_one, json=_credentials())
    assert response.status_code == 403
    assert api.store.get_credentials("c-two") is None


def test_register_token_opens_nothing_else(api) -> None:  # type: ignore[no-untyped-def]
    _cluster(api)
    token = _register(api)
    assert api.call("GET", "/rest/clusters/BCS-K8S-001", token=token).status_code == 403
    assert api.call("POST", "/rest/users/", token=token, json={"user_name": "x"}).status_code == 403
    assert api.call("GET", "/tunnels/clusters/BCS-K8S-001/version", token=token).status_code == 403


def test_credentials_without_token_is_401_and_user_token_is_403(api) -> None:  # type: ignore[no-untyped-def]
    _cluster(api)
    assert api.call("PUT", "/rest/clusters/BCS-K8S-001/credentials", token=None, json=_credentials()).status_code == 401
    _, user_token = api.new_user("ivan")
    assert api.call("PUT", "/rest/clusters/BCS-K8S-001/credentials", token=user_token,
                    json=_credentials()).status_code == 403


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        pytest.param({"server_addresses": "http://10.0.0.1:6443"}, "server_addresses", id="http"),
        pytest.param({"server_addresses": "10.0.0.1:6443"}, "server_addresses", id="no-scheme"),
        pytest.param({"server_addresses": "https://a:6443,https://b:6443"}, "server_addresses", id="comma"),
        pytest.param({"server_addresses": "https://a:notaport"}, "server_addresses", id="bad-port"),
        pytest.param({"server_addresses": ""}, "server_addresses", id="empty"),
        pytest.param({"cacert_data": "not a pem"}, "cacert_data", id="not-pem"),
        pytest.param({"cacert_data": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"},
                     "cacert_data", id="broken-pem"),
        pytest.param({"user_token": ""}, "user_token", id="empty-token"),
        pytest.param({"user_token": 12}, "user_token", id="token-type"),
    ],
)
def test_bad_credentials_are_400_and_change_nothing(api, overrides, field) -> None:  # type: ignore[no-untyped-def]
    _cluster(api)
    token = _register(api)
    response = api.call("PUT", "/rest/clusters/BCS-K8S-001/credentials", token=token, json=_credentials(**overrides))
    assert response.status_code == 400
    message = response.get_json()["message"]
    assert message.startswith(field)
    assert "sa-token" not in message
    assert api.store.get_credentials("BCS-K8S-001") is None


def test_client_credentials_point_at_the_tunnel_with_the_gateway_ca(api, gateway_ca) -> None:  # type: ignore[no-untyped-def]
    _, token = api.new_user("judy")
    _cluster(api, token=token)
    for path in ("/rest/clusters/BCS-K8S-001/client_credentials", "/clusters/BCS-K8S-001/client_credentials"):
        response = api.call("GET", path, token=token, base_url="https://localhost:8443")
        assert response.status_code == 200
        body = response.get_json()
        assert body == {
            "cluster_id": "BCS-K8S-001",
            "server_address": "https://localhost:8443/tunnels/clusters/BCS-K8S-001/",
            "server_address_path": "/tunnels/clusters/BCS-K8S-001/",
            "user_token": token,
            "cacert_data": gateway_ca.cert_pem.bytes().decode(),
        }


def test_kubeconfig_is_ready_to_use(api, gateway_ca) -> None:  # type: ignore[no-untyped-def]
    import base64

    import yaml

    _, token = api.new_user("kim")
    _cluster(api, token=token)
    response = api.call("GET", "/rest/clusters/BCS-K8S-001/kubeconfig", token=token, base_url="https://localhost:8443")
    assert response.status_code == 200
    config = yaml.safe_load(response.data)
    cluster = config["clusters"][0]["cluster"]
    assert cluster["server"] == "https://localhost:8443/tunnels/clusters/BCS-K8S-001/"
    assert base64.b64decode(cluster["certificate-authority-data"]) == gateway_ca.cert_pem.bytes()
    assert config["users"][0]["user"]["token"] == token


def test_management_changes_are_audited_without_secrets(api) -> None:  # type: ignore[no-untyped-def]
    _cluster(api)
    token = _register(api)
    api.call("PUT", "/rest/clusters/BCS-K8S-001/credentials", token=token, json=_credentials())
    actions = [(a.actor, a.action, a.target) for a in api.store.list_audit()]
    assert ("admin", "cluster.create", "cluster:BCS-K8S-001") in actions
    assert ("admin", "register_token.create", "cluster:BCS-K8S-001") in actions
    assert ("cluster-agent:BCS-K8S-001", "credentials.put", "cluster:BCS-K8S-001") in actions
    dump = str(api.store.list_audit())
    assert token not in dump and "sa-token" not in dump


def test_unknown_route_and_method(api) -> None:  # type: ignore[no-untyped-def]
    assert api.call("GET", "/rest/nothing").status_code == 404
    assert api.call("PATCH", "/rest/clusters/bcs").status_code == 405
    # "bcs" is also a valid cluster id: DELETE addresses that cluster (there is none here).
    assert api.call("DELETE", "/rest/clusters/bcs").get_json()["code_name"] == "CLUSTER_NOT_FOUND"


def test_health_needs_no_token(api) -> None:  # type: ignore[no-untyped-def]
    assert api.call("GET", "/healthz", token=None).status_code == 200
    assert api.call("GET", "/readyz", token=None).get_json()["store"] == "ok"
