"""The token auth filter alone in front of a foreign WSGI app, with identity-provider JWTs beside its tokens.

A PasteDeploy pipeline (``egg:bcs-middleware#token_auth`` with a tokens file and an
``authentication_config``) under real gunicorn, and a real OpenID provider on HTTPS.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import trustme

from bcs_middleware.core.errors import ConfigError
from bcs_middleware.layers.auth import filter_factory
from bcs_middleware.store.crypto import token_digest
from tests.support.oidc_provider import served_provider
from tests.support.servers import gunicorn, http_get


def test_token_auth_filter_accepts_provider_jwts_beside_its_tokens(tmp_path: Path) -> None:
    ca = trustme.CA()
    token = "t" * 43
    tokens = tmp_path / "tokens"
    tokens.write_text(f"webuser {token_digest(token)}\n")
    with served_provider(tmp_path / "provider", ca) as provider:
        auth = tmp_path / "authentication.yaml"
        auth.write_text(textwrap.dedent(f"""
            apiVersion: apiserver.config.k8s.io/v1beta1
            kind: AuthenticationConfiguration
            jwt:
            - issuer:
                url: {provider.issuer}
                audiences: [foreign-app]
                certificateAuthority: {json.dumps(ca.cert_pem.bytes().decode())}
              claimMappings:
                username: {{claim: sub, prefix: "idp:"}}
                groups: {{claim: groups, prefix: ""}}
        """))
        ini = tmp_path / "app.ini"
        ini.write_text(textwrap.dedent(f"""
            [pipeline:main]
            pipeline = token_auth myapp

            [filter:token_auth]
            use = egg:bcs-middleware#token_auth
            tokens_file = {tokens}
            authentication_config = {auth}
            superuser_groups = admins

            [app:myapp]
            paste.app_factory = tests.support.foreign_app:app_factory
        """))
        jwt = provider.id_token("alice", client_id="foreign-app", claims={"groups": ["admins"]})
        foreign = provider.id_token("bob", client_id="another-app")
        with gunicorn(str(ini), workers=1) as server:
            status, _, body = http_get(f"{server.url}/hello", headers={"Authorization": f"Bearer {jwt}"},
                                       timeout=60)
            assert status == 200 and b'"user": "idp:alice"' in body and b'"superuser": true' in body, body
            status, _, body = http_get(f"{server.url}/hello", headers={"Authorization": f"Bearer {token}"})
            assert status == 200 and b'"user": "webuser"' in body
            status, _, body = http_get(f"{server.url}/hello", headers={"Authorization": f"Bearer {foreign}"})
            assert status == 401 and b"audience" in body
        output = server.output()
    assert jwt not in output and token not in output


def test_token_auth_filter_anonymous_in_front_of_a_foreign_app(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"webuser {token_digest('t' * 43)}\n")
    auth = tmp_path / "authentication.yaml"
    auth.write_text(textwrap.dedent("""
        apiVersion: apiserver.config.k8s.io/v1
        kind: AuthenticationConfiguration
        anonymous:
          enabled: true
          conditions: [{path: /hello}]
    """))
    ini = tmp_path / "app.ini"
    ini.write_text(textwrap.dedent(f"""
        [pipeline:main]
        pipeline = token_auth myapp

        [filter:token_auth]
        use = egg:bcs-middleware#token_auth
        tokens_file = {tokens}
        authentication_config = {auth}

        [app:myapp]
        paste.app_factory = tests.support.foreign_app:app_factory
    """))
    with gunicorn(str(ini), workers=1) as server:
        status, _, body = http_get(f"{server.url}/hello")
        assert status == 200 and b'"user": "system:anonymous"' in body and b'"superuser": false' in body, body
        status, _, body = http_get(f"{server.url}/other")
        assert status == 401, body
        status, _, body = http_get(f"{server.url}/hello", headers={"Authorization": "Bearer " + "x" * 43})
        assert status == 401, body  # a token that fails is never read as no token


def test_token_auth_filter_refuses_required_beside_the_files_anonymous(tmp_path: Path) -> None:
    # kube-apiserver refuses --anonymous-auth beside the file's anonymous, whatever either says.
    tokens = tmp_path / "tokens"
    tokens.write_text(f"webuser {token_digest('t' * 43)}\n")
    auth = tmp_path / "authentication.yaml"
    auth.write_text("apiVersion: apiserver.config.k8s.io/v1\nkind: AuthenticationConfiguration\n"
                    "anonymous: {enabled: false}\n")
    for required in ("true", "false"):
        with pytest.raises(ConfigError, match="required cannot be set when anonymous is configured"):
            filter_factory({}, tokens_file=str(tokens), authentication_config=str(auth), required=required)
    assert callable(filter_factory({}, tokens_file=str(tokens), authentication_config=str(auth)))
