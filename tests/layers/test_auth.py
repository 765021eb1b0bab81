"""The token auth layer on its own, in front of an app that is not ours."""

from __future__ import annotations

import random
import textwrap
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from werkzeug.test import Client

from bcs_middleware.core import environ as env
from bcs_middleware.core.errors import ConfigError
from bcs_middleware.layers.auth import (
    CachingAuthenticator,
    StaticAuthenticator,
    StoreAuthenticator,
    TokenAuthMiddleware,
    bearer_token,
    filter_factory,
)
from bcs_middleware.store.crypto import token_digest
from bcs_middleware.store.sql import open_store
from tests.support.foreign_app import application
from tests.support.polling import wait_until
from tests.support.servers import gunicorn, http_get

TOKEN = "static-token-value-0123456789abcdefghijklmno"


@pytest.fixture
def client() -> Client:
    auth = StaticAuthenticator.from_tokens({TOKEN: env.User(1, "svc", True, ("ops",))})
    return Client(TokenAuthMiddleware(application, authenticator=auth, public_paths=["/public/", "/healthz"]))


def test_valid_token_reaches_the_app_as_a_user(client: Client) -> None:
    body = client.get("/x", headers={"Authorization": f"Bearer {TOKEN}"}).get_json()
    assert body["user"] == "svc" and body["superuser"] is True


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        pytest.param("/x", {}, 401, id="missing-token"),
        pytest.param("/x", {"Authorization": "Bearer wrong"}, 401, id="wrong-token"),
        pytest.param("/public/page", {}, 200, id="public-prefix"),
        pytest.param("/healthz", {}, 200, id="public-exact"),
        pytest.param("/healthzx", {}, 401, id="not-a-prefix-match"),
        pytest.param("/public/page", {"Authorization": "Bearer wrong"}, 200, id="public-ignores-bad-token"),
    ],
)
def test_access_rules(client: Client, path: str, headers: dict[str, str], status: int) -> None:
    response = client.get(path, headers=headers)
    assert response.status_code == status
    if status == 401:
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert set(response.get_json()) == {"code_name", "message"}


def _bearer_token_reference(header: str | None) -> str | None:
    """The header's rule spelled the slow way: scheme "bearer" (any case), one token."""
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token and " " not in token else ""


def test_bearer_token_fast_path_gives_the_reference_answer_for_any_header() -> None:
    rng = random.Random(11)  # noqa: S311 - reproducible test data
    pieces = ["Bearer", "bearer", "BEARER", "Basic", " ", "  ", "\t", "\xa0", "\u2028", "\x00", "abc", "é",
              "tok-EN_0123", "=", "\r\n", ""]
    headers = [None, "", "Bearer", "Bearer ", "Bearer  x", "Bearer x ", "Bearer x\t", "Bearer x\xa0",
               "Bearer a b", " Bearer x", "bearer x", "Bearer\tx"]
    headers += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 6))) for _ in range(5000)]
    for header in headers:
        environ = {} if header is None else {"HTTP_AUTHORIZATION": header}
        assert bearer_token(environ) == _bearer_token_reference(header), repr(header)


def test_public_paths_match_exactly_or_below() -> None:
    layer = TokenAuthMiddleware(application, authenticator=StaticAuthenticator([]),
                                public_paths=["/public/", "/healthz", "/a/b"])
    for path, public in [("/public/", True), ("/public/x/y", True), ("/public", False),
                         ("/healthz", True), ("/healthz/deep", True), ("/healthzx", False),
                         ("/a/b", True), ("/a/b/c", True), ("/a/bc", False), ("/a", False), ("", False)]:
        assert layer.is_public(path) is public, path


def test_the_token_cache_is_bounded_and_drops_its_oldest_entries() -> None:
    calls: list[str] = []

    class Counting:
        def authenticate(self, token: str) -> env.User | None:
            calls.append(token)
            return env.User(len(calls), token) if token.startswith("good") else None

    cache = CachingAuthenticator(Counting(), ttl=60, max_entries=3)
    for token in ("good-1", "bad-1", "good-2", "good-1", "bad-1"):
        cache.authenticate(token)
    assert calls == ["good-1", "bad-1", "good-2"]  # hits, negative answers included
    cache.authenticate("good-3")  # full: the oldest (good-1) goes
    assert len(cache._cache) == 3
    assert token_digest("good-1") not in cache._cache
    assert cache.authenticate("good-2") == env.User(3, "good-2")
    cache.authenticate("good-1")
    assert calls[-1] == "good-1" and len(calls) == 5


def test_principal_cannot_be_injected_from_outside(client: Client) -> None:
    body = client.get("/public/p", environ_overrides={env.USER: env.User(9, "root", True)}).get_json()
    assert body["user"] is None


def test_tokens_file_holds_only_digests(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"# name digest flags\nrobot {token_digest(TOKEN)} superuser ci,ops\n")
    user = StaticAuthenticator.from_file(path).authenticate(TOKEN)
    assert user == env.User(2, "robot", True, ("ci", "ops"))
    path.write_text(f"robot {TOKEN}\n")
    with pytest.raises(ConfigError, match="SHA256_HEX"):
        StaticAuthenticator.from_file(path)


def test_revocation_takes_effect_within_the_cache_ttl(tmp_path: Path) -> None:
    store = open_store(data_dir=tmp_path)
    user = store.create_user("u")
    token_rec, token = store.create_token(user.id)
    cached = CachingAuthenticator(StoreAuthenticator(store), ttl=0.5)
    assert cached.authenticate(token) == env.User(user.id, "u", False, ())
    store.revoke_token(user.id, token_rec.id)
    assert wait_until(lambda: cached.authenticate(token) is None, 5), "revoked token still accepted after the TTL"
    store.db.dispose()


def test_filter_factory_rejects_unknown_keys_and_needs_a_source() -> None:
    with pytest.raises(ConfigError, match=r"\[filter:token_auth\] unknown key 'databse_url'"):
        filter_factory({}, databse_url="sqlite://")
    with pytest.raises(ConfigError, match="needs data_dir, database_url or tokens_file"):
        filter_factory({})
    with pytest.raises(ConfigError, match="cache_ttl"):
        filter_factory({}, tokens_file="x", cache_ttl="soon")


def test_token_auth_in_front_of_a_foreign_app_under_gunicorn(tmp_path: Path) -> None:
    key = Fernet.generate_key().decode()
    url = f"sqlite:///{tmp_path / 'auth.db'}"
    store = open_store(url, secret_key=key)
    user = store.create_user("webuser")
    _, token = store.create_token(user.id)
    store.db.dispose()
    ini = tmp_path / "app.ini"
    ini.write_text(textwrap.dedent(f"""
        [pipeline:main]
        pipeline = token_auth myapp

        [filter:token_auth]
        use = egg:bcs-middleware#token_auth
        database_url = {url}
        secret_key = {key}
        public_paths = /healthz

        [app:myapp]
        paste.app_factory = tests.support.foreign_app:app_factory
    """))
    with gunicorn(str(ini), workers=2) as server:
        status, _, body = http_get(f"{server.url}/hello", headers={"Authorization": f"Bearer {token}"})
        assert status == 200 and b'"user": "webuser"' in body
        assert http_get(f"{server.url}/hello")[0] == 401
        assert http_get(f"{server.url}/healthz")[0] == 200
    output = server.output()
    assert token not in output


def test_gunicorn_paste_serves_the_gateway_ini(tmp_path: Path) -> None:
    token_file = tmp_path / "admin.token"
    token_file.write_text("p" * 43)
    ini = tmp_path / "gateway.ini"
    ini.write_text(textwrap.dedent(f"""
        [app:main]
        use = egg:bcs-middleware#gateway
        data_dir = {tmp_path / 'data'}
        bootstrap_users =
            admin = file:{token_file}
    """))
    with gunicorn(str(ini), workers=2) as server:
        status, _, body = http_get(f"{server.url}/rest/users/admin", headers={"Authorization": "Bearer " + "p" * 43})
        assert status == 200 and b'"is_super_user": true' in body
