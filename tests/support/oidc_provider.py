"""A real OpenID provider on loopback, over TLS: ``oidc-provider-mock`` served by gunicorn.

``oidc-provider-mock`` (PyPI) is a Flask OpenID provider with discovery, JWKS, the
authorization, token and refresh endpoints and per-user claims (``PUT /users/{sub}``);
its ID tokens are RS256 and carry no ``kid``. Each :func:`served_provider` is its own
gunicorn process (the provider keeps its keys and users in process memory, so two
providers are two issuers with two key sets), on HTTPS with a certificate of the test's
CA, so its issuer URL is ``https://localhost:{port}`` as the authenticator requires.

:meth:`Provider.id_token` drives the authorization-code flow headlessly, as the
provider's own form does: the form's POST with ``sub``, the redirect's ``code``, the
token endpoint. ``POST /test/rotate-key`` (added here) makes the provider sign with a
new key from then on, and a refresh is answered with a new ID token, as real providers do.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.support.servers import free_port, gunicorn

REPO = Path(__file__).resolve().parents[2]
REDIRECT_URI = "http://127.0.0.1:9/callback"


def create(max_age: str = "3600") -> Any:
    """The gunicorn app factory: the provider, ID tokens valid ``max_age`` seconds, plus key rotation."""
    import flask
    from authlib import jose
    from oidc_provider_mock import app

    application = app(access_token_max_age=timedelta(seconds=float(max_age)))

    @application.post("/test/rotate-key")
    def rotate_key() -> tuple[str, int]:
        flask.g.oidc_provider_mock_storage.jwk = jose.RSAKey.generate_key(is_private=True)
        return "", 204

    @application.after_request
    def id_token_on_refresh(response: Any) -> Any:
        # Keycloak, Dex, Okta… answer a refresh with a new ID token (OpenID Connect Core §12.2);
        # the mock issues one only for the authorization code: added here, signed as it signs.
        request = flask.request
        if request.path != "/oauth2/token" or request.form.get("grant_type") != "refresh_token" \
                or response.status_code != 200:
            return response
        storage = flask.g.oidc_provider_mock_storage
        refresh = storage.get_refresh_token(request.form.get("refresh_token", ""))
        user = storage.get_user(refresh.user_id)
        now = int(time.time())
        claims = {**user.claims, "sub": user.sub, "iss": request.host_url.rstrip("/"), "aud": [refresh.client_id],
                  "iat": now, "exp": now + int(float(max_age))}
        id_token = jose.jwt.encode({"alg": "RS256"}, claims, storage.jwk).decode()
        body = json.loads(response.get_data())
        response.set_data(json.dumps({**body, "id_token": id_token}))
        return response

    return application


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass
class Provider:
    port: int
    ca_file: str

    @property
    def issuer(self) -> str:
        return f"https://localhost:{self.port}"

    def _context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca_file)

    def request(self, method: str, path: str, *, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(self.issuer + path, data=body, method=method, headers=headers or {})
        opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=self._context()), _NoRedirect)
        try:
            with opener.open(req, timeout=30) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    def set_user(self, sub: str, claims: dict[str, Any]) -> None:
        status, _, body = self.request("PUT", f"/users/{urllib.parse.quote(sub)}", body=json.dumps(claims).encode(),
                                       headers={"Content-Type": "application/json"})
        assert status == 204, body

    def rotate_key(self) -> None:
        status, _, body = self.request("POST", "/test/rotate-key")
        assert status == 204, body

    def authorization_code(self, sub: str, *, client_id: str, redirect_uri: str = REDIRECT_URI,
                           scope: str = "openid email profile", extra: dict[str, str] | None = None) -> str:
        """The code the provider's form gives ``sub`` (what a person's browser would carry back)."""
        query = urllib.parse.urlencode({"client_id": client_id, "redirect_uri": redirect_uri, "response_type": "code",
                                        "scope": scope, **(extra or {})})
        status, headers, body = self.request(
            "POST", f"/oauth2/authorize?{query}", body=urllib.parse.urlencode({"sub": sub}).encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert status == 302, (status, body)
        location = urllib.parse.urlsplit(headers["Location"])
        return urllib.parse.parse_qs(location.query)["code"][0]

    def tokens(self, sub: str, *, client_id: str, claims: dict[str, Any] | None = None) -> dict[str, Any]:
        """The token endpoint's answer (``id_token``, ``refresh_token``…) for ``sub`` with ``claims``."""
        if claims is not None:
            self.set_user(sub, claims)
        code = self.authorization_code(sub, client_id=client_id)
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT_URI, "client_id": client_id,
                "client_secret": "any"}  # the provider accepts any secret of an unregistered client
        status, _, body = self.request("POST", "/oauth2/token", body=urllib.parse.urlencode(form).encode(),
                                       headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert status == 200, body
        return dict(json.loads(body))

    def id_token(self, sub: str, *, client_id: str, claims: dict[str, Any] | None = None) -> str:
        return str(self.tokens(sub, client_id=client_id, claims=claims)["id_token"])

    def jwks(self) -> dict[str, Any]:
        status, _, body = self.request("GET", "/jwks")
        assert status == 200, body
        return dict(json.loads(body))


@contextmanager
def served_provider(tls_dir: Path, ca: Any, *, max_age: float = 3600) -> Iterator[Provider]:
    """One provider on ``https://localhost:{port}`` with a certificate of the trustme ``ca``."""
    tls_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert_file, key_file, ca_file = tls_dir / "provider.crt", tls_dir / "provider.key", tls_dir / "ca.crt"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    for pem in cert.cert_chain_pems[1:]:
        pem.write_to_path(str(cert_file), append=True)
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    with gunicorn(f"tests.support.oidc_provider:create('{max_age:g}')", port=port, workers=1, worker_class="gthread",
                  certfile=str(cert_file), keyfile=str(key_file),
                  env={"PYTHONPATH": str(REPO)}):
        yield Provider(port, str(ca_file))
