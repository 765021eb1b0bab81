from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from .conftest import ADMIN_TOKEN


def test_superuser_creates_and_reads_a_user(api) -> None:  # type: ignore[no-untyped-def]
    created = api.call("POST", "/rest/users/", json={"user_name": "alice"})
    assert created.status_code == 201
    body = created.get_json()
    assert body["name"] == "alice" and body["is_super_user"] is False
    read = api.call("GET", "/rest/users/alice")
    assert read.status_code == 200 and read.get_json()["id"] == body["id"]


def test_duplicate_user_is_a_conflict(api) -> None:  # type: ignore[no-untyped-def]
    assert api.call("POST", "/rest/users/", json={"user_name": "bob"}).status_code == 201
    again = api.call("POST", "/rest/users/", json={"user_name": "bob"})
    assert again.status_code == 409
    assert again.get_json()["code_name"] == "USER_EXISTS"


def test_unknown_user_is_not_found(api) -> None:  # type: ignore[no-untyped-def]
    response = api.call("GET", "/rest/users/nobody")
    assert response.status_code == 404
    assert set(response.get_json()) == {"code_name", "message"}


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        pytest.param({}, "missing bearer token", id="missing"),
        pytest.param({"Authorization": "Bearer not-a-real-token"}, "invalid", id="unknown"),
        pytest.param({"Authorization": "Basic YWRtaW46eA=="}, "malformed", id="wrong-scheme"),
        pytest.param({"Authorization": "Bearer"}, "malformed", id="empty"),
    ],
)
def test_bad_credentials_get_401_with_www_authenticate(api, headers, message) -> None:  # type: ignore[no-untyped-def]
    response = api.call("GET", "/rest/users/admin", token=None, headers=headers)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert message in response.get_json()["message"]


def test_ordinary_user_may_not_manage_users(api) -> None:  # type: ignore[no-untyped-def]
    _, token = api.new_user("carol")
    response = api.call("POST", "/rest/users/", token=token, json={"user_name": "mallory"})
    assert response.status_code == 403
    assert api.store.find_user("mallory") is None


def test_token_value_is_shown_once_and_listing_has_no_values(api) -> None:  # type: ignore[no-untyped-def]
    user_id, token = api.new_user("dave")
    assert len(token) == 43  # 256 random bits, url-safe base64
    listed = api.call("GET", f"/rest/users/{user_id}/tokens").get_json()
    assert len(listed) == 1
    assert "user_token" not in listed[0] and token not in str(listed)
    # The token works, and only its digest is stored.
    assert api.call("GET", "/rest/clusters/none", token=token).status_code == 404
    with api.store.db.engine.connect() as conn:
        dump = "\n".join(str(row) for row in conn.exec_driver_sql("SELECT * FROM user_tokens"))
    assert token not in dump


def test_revoked_token_stops_working(api) -> None:  # type: ignore[no-untyped-def]
    user_id, token = api.new_user("erin")
    token_id = api.call("GET", f"/rest/users/{user_id}/tokens").get_json()[0]["id"]
    revoked = api.call("DELETE", f"/rest/users/{user_id}/tokens/{token_id}")
    assert revoked.status_code == 200 and revoked.get_json()["revoked_at"]
    assert api.call("GET", "/rest/clusters/x", token=token).status_code == 401
    assert api.call("DELETE", f"/rest/users/{user_id}/tokens/999").status_code == 404


def test_expired_token_is_refused(api) -> None:  # type: ignore[no-untyped-def]
    user = api.store.create_user("frank")
    _, token = api.store.create_token(user.id, expires_at=datetime.now(UTC) - timedelta(seconds=1))
    api.tokens.append(token)
    assert api.call("GET", "/rest/clusters/x", token=token).status_code == 401


def test_token_with_expiry_and_type(api) -> None:  # type: ignore[no-untyped-def]
    user_id, _ = api.new_user("gina")
    response = api.call("POST", f"/rest/users/{user_id}/tokens", json={"expires_in": 3600, "token_type": "service"})
    assert response.status_code == 201
    body = response.get_json()
    api.tokens.append(body["user_token"])
    assert body["type"] == "service" and body["expires_at"]


def test_token_for_unknown_user_is_not_found(api) -> None:  # type: ignore[no-untyped-def]
    assert api.call("POST", "/rest/users/4242/tokens").status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param({}, "user_name", id="missing"),
        pytest.param({"user_name": 5}, "user_name", id="wrong-type"),
        pytest.param({"user_name": ""}, "user_name", id="empty"),
        pytest.param({"user_name": "a b"}, "user_name", id="bad-chars"),
        pytest.param({"user_name": "x", "admin": True}, "admin", id="unknown-field"),
        pytest.param(["user_name"], "(body)", id="not-an-object"),
    ],
)
def test_bad_user_bodies_are_400_naming_the_field(api, body, field) -> None:  # type: ignore[no-untyped-def]
    response = api.call("POST", "/rest/users/", json=body)
    assert response.status_code == 400
    assert field in response.get_json()["message"]
    assert api.store.find_user("x") is None


def test_bootstrap_admin_is_a_superuser(api) -> None:  # type: ignore[no-untyped-def]
    admin = api.call("GET", "/rest/users/admin", token=ADMIN_TOKEN).get_json()
    assert admin["is_super_user"] is True
