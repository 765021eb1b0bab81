"""Sign in with the identity provider: authorization code + PKCE on a loopback redirect, refresh, logout.

``login --issuer URL --client-id ID`` runs OAuth 2.0's authorization-code flow for a native
app (RFC 8252): a one-shot HTTP listener on ``127.0.0.1`` (an ephemeral port, RFC 8252 §7.3)
receives the redirect; PKCE with ``S256`` (RFC 7636) binds the code to this process; a
random ``state`` is checked on the way back (RFC 6749 §10.12). The browser is opened, or with
``--no-browser`` the URL is printed for the user to open. The answer's ID token is the
bearer token the gateway verifies.

What is kept (:data:`CREDENTIALS` beside the client's config file, mode 0600): the issuer,
client id (and secret, when the provider wants one), token endpoint, refresh token, and the
current ID token with its expiry. ``credential`` (the kubectl exec plugin) prints
``client.authentication.k8s.io/v1`` ``ExecCredential`` with that token and its
``expirationTimestamp``; within :data:`EARLY` seconds of expiry it first uses the refresh
token (a provider that answers a refresh without a new ID token ends the session: the user
runs ``login`` again). ``logout`` forgets the tokens and removes the kube contexts ``login``
wrote.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import secrets
import sys
import threading
import time
import urllib.parse
import webbrowser
from pathlib import Path
from typing import Any

import requests

from .rest import EXIT_USAGE, ClientError
from .settings import config_path, write_private

__all__ = ["CREDENTIALS", "exec_credential", "fresh_id_token", "sign_in"]

#: Seconds before expiry at which ``credential`` refreshes instead of handing the token out.
EARLY = 30
#: How long ``login`` waits for the browser to come back.
WAIT_FOR_BROWSER = 300.0
HTTP_TIMEOUT = 30.0
EXEC_API_VERSION = "client.authentication.k8s.io/v1"


def credentials_path() -> Path:
    return config_path().with_name("oidc.json")


CREDENTIALS = credentials_path


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _expiry(id_token: str) -> float:
    """The ``exp`` of a JWT, read only to know when to refresh (the gateway verifies it)."""
    try:
        payload = id_token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"])
    except (IndexError, ValueError, KeyError, TypeError):
        raise ClientError("the identity provider answered without a usable ID token") from None


def _verify(ca_file: str | None) -> str | bool:
    return ca_file or True


def discover(issuer: str, ca_file: str | None) -> dict[str, Any]:
    url = issuer.rstrip("/") + "/.well-known/openid-configuration"
    try:
        answer = requests.get(url, timeout=HTTP_TIMEOUT, verify=_verify(ca_file))
    except requests.RequestException as exc:
        raise ClientError(f"cannot reach the identity provider {issuer}: {type(exc).__name__}") from None
    if answer.status_code != 200:
        raise ClientError(f"{url} answered HTTP {answer.status_code}")
    document = answer.json()
    if not isinstance(document, dict) or document.get("issuer") != issuer:
        raise ClientError(f"{url} describes another issuer than {issuer}")
    return document


class _Callback(http.server.BaseHTTPRequestHandler):
    result: dict[str, str] = {}
    done = threading.Event()

    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        type(self).result = {k: v[0] for k, v in query.items() if v}
        body = b"Signed in: you may close this window and return to the terminal.\n"
        if "error" in query:
            body = b"Sign-in failed: see the terminal.\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        type(self).done.set()

    def log_message(self, format: str, *args: Any) -> None:  # the query holds the code: never logged
        pass


def _token_request(endpoint: str, form: dict[str, str], *, client_id: str, client_secret: str | None,
                   ca_file: str | None) -> dict[str, Any]:
    auth = (client_id, client_secret) if client_secret else None
    if auth is None:
        form = {**form, "client_id": client_id}
    try:
        answer = requests.post(endpoint, data=form, auth=auth, timeout=HTTP_TIMEOUT, verify=_verify(ca_file))
    except requests.RequestException as exc:
        raise ClientError(f"cannot reach the token endpoint: {type(exc).__name__}") from None
    try:
        document = answer.json()
    except ValueError:
        document = {}
    if answer.status_code != 200 or not isinstance(document, dict):
        error = document.get("error", f"HTTP {answer.status_code}") if isinstance(document, dict) else "?"
        raise ClientError(f"the identity provider refused: {error}")
    return document


def sign_in(*, issuer: str, client_id: str, client_secret: str | None, ca_file: str | None, scopes: str,
            open_browser: bool) -> dict[str, Any]:
    """Run the authorization-code flow; the credentials to keep."""
    provider = discover(issuer, ca_file)
    verifier = _b64url(secrets.token_bytes(48))
    challenge = _b64url(hashlib.sha256(verifier.encode()).digest())
    state = _b64url(secrets.token_bytes(24))
    # A class per login: its answer and event are this login's alone.
    handler: type[_Callback] = type("Callback", (_Callback,), {"result": {}, "done": threading.Event()})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    redirect_uri = f"http://127.0.0.1:{server.server_address[1]}/callback"
    url = provider["authorization_endpoint"] + "?" + urllib.parse.urlencode({
        "response_type": "code", "client_id": client_id, "redirect_uri": redirect_uri, "scope": scopes,
        "state": state, "code_challenge": challenge, "code_challenge_method": "S256"})
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    try:
        print(f"Open this URL to sign in:\n{url}", file=sys.stderr, flush=True)
        if open_browser:
            webbrowser.open(url)
        if not handler.done.wait(WAIT_FOR_BROWSER):
            raise ClientError(f"no sign-in within {WAIT_FOR_BROWSER:.0f}s", exit_code=EXIT_USAGE)
    finally:
        server.shutdown()
        server.server_close()
    result = handler.result
    if "error" in result:
        raise ClientError(f"the identity provider refused the sign-in: {result['error']}")
    if not secrets.compare_digest(result.get("state", ""), state):
        raise ClientError("the sign-in answer does not belong to this login (state mismatch)")
    tokens = _token_request(provider["token_endpoint"], {
        "grant_type": "authorization_code", "code": result.get("code", ""), "redirect_uri": redirect_uri,
        "code_verifier": verifier}, client_id=client_id, client_secret=client_secret, ca_file=ca_file)
    id_token = tokens.get("id_token")
    if not isinstance(id_token, str):
        raise ClientError("the identity provider answered without an ID token (is the openid scope allowed?)")
    return {"issuer": issuer, "client_id": client_id, "client_secret": client_secret, "ca_file": ca_file,
            "token_endpoint": provider["token_endpoint"], "refresh_token": tokens.get("refresh_token"),
            "id_token": id_token, "expires_at": _expiry(id_token)}


def save(credentials: dict[str, Any]) -> Path:
    path = credentials_path()
    write_private(path, json.dumps(credentials, indent=2) + "\n")
    return path


def load() -> dict[str, Any]:
    try:
        data = json.loads(credentials_path().read_text())
    except FileNotFoundError:
        raise ClientError("not signed in: run bcs-middleware login --issuer ...", exit_code=EXIT_USAGE) from None
    except (OSError, ValueError) as exc:
        raise ClientError(f"cannot read {credentials_path()}: {type(exc).__name__}") from None
    if not isinstance(data, dict) or not isinstance(data.get("id_token"), str):
        raise ClientError(f"{credentials_path()} holds no sign-in: run bcs-middleware login")
    return data


def fresh_id_token(now: float | None = None) -> tuple[str, float]:
    """The current ID token and its expiry, refreshed first when it is about to expire."""
    credentials = load()
    now = time.time() if now is None else now
    if float(credentials["expires_at"]) - EARLY > now:
        return credentials["id_token"], float(credentials["expires_at"])
    if not credentials.get("refresh_token"):
        raise ClientError("the sign-in expired and there is no refresh token: run bcs-middleware login")
    tokens = _token_request(credentials["token_endpoint"], {
        "grant_type": "refresh_token", "refresh_token": credentials["refresh_token"]},
        client_id=credentials["client_id"], client_secret=credentials.get("client_secret"),
        ca_file=credentials.get("ca_file"))
    id_token = tokens.get("id_token")
    if not isinstance(id_token, str):
        raise ClientError("the identity provider refreshed without a new ID token: run bcs-middleware login")
    credentials.update(id_token=id_token, expires_at=_expiry(id_token),
                       refresh_token=tokens.get("refresh_token") or credentials["refresh_token"])
    save(credentials)
    return id_token, float(credentials["expires_at"])


def exec_credential() -> dict[str, Any]:
    """kubectl's ``ExecCredential`` (``client.authentication.k8s.io/v1``) for the current sign-in."""
    token, expires_at = fresh_id_token()
    return {"apiVersion": EXEC_API_VERSION, "kind": "ExecCredential", "status": {
        "token": token, "expirationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires_at))}}


def forget() -> bool:
    """Remove the kept sign-in; whether there was one."""
    path = credentials_path()
    existed = path.exists()
    path.unlink(missing_ok=True)
    return existed
