"""Attacks on sign-in with identity-provider JWTs, through a real ``bcs-middleware serve``.

Two real OpenID providers (``oidc-provider-mock`` under gunicorn, HTTPS on loopback with a
test CA: :mod:`tests.support.oidc_provider`) are two issuers of one
``AuthenticationConfiguration``; the gateway fetches their discovery documents and keys
through its outbound stack. ``ONE`` maps ``sub`` with the prefix ``one:`` and requires a
verified email; ``TWO`` maps ``sub`` without a prefix (so a ``system:`` subject would become a
``system:`` user name) and its ID tokens live :data:`SHORT_LIFE` seconds. A fake apiserver
behind the gateway records the ``Impersonate-*`` headers each request carried, and the
permission subscription grants the group ``dev`` ``view`` on one cluster only.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import socket
import ssl
import stat
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jwt
import pytest
import trustme
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support.fake_apiserver import FakeAPIServer, rbac_authorizer
from tests.support.gateway import CLI, SA_TOKEN, Gateway, gateway_ini, register_cluster, served_gateway
from tests.support.kube import kubectl, write_kubeconfig
from tests.support.oidc_provider import Provider, served_provider
from tests.support.polling import wait_until

AUDIENCE = "bcs-gateway"
SHORT_LIFE = 6
VIEWED = "BCS-K8S-OIDC1"
OTHER = "BCS-K8S-OIDC2"


@dataclass
class World:
    gw: Gateway
    api: FakeAPIServer
    one: Provider
    two: Provider
    #: an issuer whose address accepts connections and never answers (a provider that hangs)
    hung: str
    #: an issuer whose address refuses connections (a provider that is down)
    down: str
    #: the permission subscription's file (the gateway re-reads it when it changes)
    grants: Path
    #: the CA the providers' certificates (and any test server's) come from
    ca: trustme.CA


def _authentication_config(path: Path, one: Provider, two: Provider, hung: str, down: str, ca_pem: str) -> Path:
    config = {
        "apiVersion": "apiserver.config.k8s.io/v1beta1",
        "kind": "AuthenticationConfiguration",
        "jwt": [
            {
                "issuer": {"url": one.issuer, "audiences": [AUDIENCE], "certificateAuthority": ca_pem},
                "claimValidationRules": [{"expression": "claims.email_verified == true",
                                          "message": "the email must be verified"}],
                "claimMappings": {
                    "username": {"claim": "sub", "prefix": "one:"},
                    "groups": {"claim": "groups", "prefix": ""},
                    "uid": {"expression": "'uid-' + claims.sub"},
                    "extra": [{"key": "example.com/email", "valueExpression": "claims.email"}],
                },
                "userValidationRules": [{"expression": "!user.username.startsWith('one:blocked')",
                                         "message": "this user is blocked"}],
            },
            {
                "issuer": {"url": two.issuer, "audiences": [AUDIENCE, "other"], "audienceMatchPolicy": "MatchAny",
                           "certificateAuthority": ca_pem},
                "claimMappings": {"username": {"claim": "sub", "prefix": ""},
                                  "groups": {"expression": "has(claims.groups) ? claims.groups : []"}},
                # kube-apiserver refuses system: names only by such rules (its documented example).
                "userValidationRules": [
                    {"expression": "!user.username.startsWith('system:')",
                     "message": "username cannot used reserved system: prefix"},
                    {"expression": "user.groups.all(group, !group.startsWith('system:'))",
                     "message": "groups cannot used reserved system: prefix"}],
            },
            {
                "issuer": {"url": hung, "audiences": [AUDIENCE], "certificateAuthority": ca_pem},
                "claimMappings": {"username": {"claim": "sub", "prefix": "hung:"}},
            },
            {
                "issuer": {"url": down, "audiences": [AUDIENCE], "certificateAuthority": ca_pem},
                "claimMappings": {"username": {"claim": "sub", "prefix": "down:"}},
            },
        ],
    }
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("oidc")
    ca = trustme.CA()
    ca_pem = ca.cert_pem.bytes().decode()
    grants = tmp / "grants.json"
    grants.write_text(json.dumps({"version": 1, "grants": [{"group": "dev", "cluster": VIEWED, "role": "view"}]}))
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(64)  # connections complete in the backlog; nothing ever answers on them
    hung = f"https://127.0.0.1:{hang.getsockname()[1]}"
    gone = socket.socket()
    gone.bind(("127.0.0.1", 0))  # bound and never listening: every connection is refused
    down = f"https://127.0.0.1:{gone.getsockname()[1]}"
    with hang, gone, served_provider(tmp / "one", ca) as one, \
            served_provider(tmp / "two", ca, max_age=SHORT_LIFE) as two:
        auth = _authentication_config(tmp / "authentication.json", one, two, hung, down, ca_pem)
        data = tmp / "data"
        ini = gateway_ini(tmp / "gateway.ini", data, rbac="true", rbac_source_file=str(grants), rbac_interval="1s",
                          authentication_config=str(auth), superuser_groups="platform-admins")
        with FakeAPIServer(token=SA_TOKEN) as api, served_gateway(data, args=["--config", str(ini)]) as gw:
            register_cluster(gw, VIEWED, server_url=api.url, ca_pem=api.ca_pem)
            register_cluster(gw, OTHER, server_url=api.url, ca_pem=api.ca_pem)
            yield World(gw, api, one, two, hung, down, grants, ca)
            output = gw.server.output()
    assert "eyJ" not in output  # no token (a JWT starts so) in any log line


def _token(provider: Provider, sub: str, **claims: Any) -> str:
    return provider.id_token(sub, client_id=AUDIENCE, claims={"email": f"{sub}@example.com", "email_verified": True,
                                                               **claims})


def _message(raw: bytes) -> str:
    return str(json.loads(raw).get("message", ""))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _forged(header: dict[str, Any], claims: dict[str, Any], sign: Any) -> str:
    signing_input = _b64(json.dumps(header).encode()) + "." + _b64(json.dumps(claims).encode())
    return signing_input + "." + _b64(sign(signing_input.encode()))


def _claims(world: World, **override: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"iss": world.one.issuer, "aud": [AUDIENCE], "sub": "mallory", "exp": now + 600, "iat": now,
            "email": "mallory@example.com", "email_verified": True, "groups": ["platform-admins"], **override}


def _whoami(world: World, token: str) -> tuple[int, bytes]:
    return world.gw.call("GET", "/rest/clusters", token=token)


def test_a_provider_token_signs_in_and_carries_its_mapped_identity_upstream(world: World) -> None:
    token = _token(world.one, "alice", groups=["dev"])
    status, raw = world.gw.call("GET", f"/tunnels/clusters/{VIEWED}/api/v1/namespaces/default/pods", token=token)
    assert status == 200, raw
    seen = world.api.requests.last("/api/v1/namespaces/default/pods")
    assert seen is not None
    assert seen.headers.get("Impersonate-User") == "one:alice"
    assert seen.headers.get("Impersonate-Uid") == "uid-alice"
    assert seen.headers.getlist("Impersonate-Group") == ["system:authenticated", "dev"]
    assert seen.headers.getlist("Impersonate-Extra-Example.com%2Femail") == ["alice@example.com"]
    assert seen.headers.get("Authorization") == f"Bearer {SA_TOKEN}"  # the user's JWT never goes upstream


def test_a_group_grant_gives_view_on_its_cluster_and_not_another(world: World) -> None:
    token = _token(world.one, "dora", groups=["dev"])
    # The subscription is read in the background: poll until its grant is seen.
    assert wait_until(lambda: world.gw.call("GET", f"/tunnels/clusters/{VIEWED}/api/v1/namespaces",
                                            token=token)[0] == 200, timeout=30, step=0.2)
    status, raw = world.gw.call("GET", f"/tunnels/clusters/{OTHER}/api/v1/namespaces", token=token)
    assert status == 404, raw
    status, raw = _whoami(world, token)
    assert status == 200, raw
    assert VIEWED.encode() in raw and OTHER.encode() not in raw


def test_the_superuser_group_makes_a_superuser(world: World) -> None:
    token = _token(world.one, "root", groups=["platform-admins"])
    status, raw = world.gw.call("GET", f"/tunnels/clusters/{OTHER}/api/v1/namespaces", token=token)
    assert status == 200, raw
    seen = world.api.requests.last("/api/v1/namespaces")
    assert seen is not None and seen.headers.get("Impersonate-User") is None


def test_client_impersonation_is_refused_for_a_provider_user(world: World) -> None:
    token = _token(world.one, "erin", groups=["dev"])
    status, raw = world.gw.call("GET", f"/tunnels/clusters/{VIEWED}/api/v1/namespaces", token=token,
                                headers={"Impersonate-User": "one:root"})
    assert status == 403, raw
    assert _message(raw) == "the Impersonate-User header is not allowed through the gateway"
    assert not [r for r in world.api.requests.snapshot() if "one:root" in r.headers.values()]  # never upstream


def test_alg_none_is_refused(world: World) -> None:
    token = _forged({"alg": "none", "typ": "JWT"}, _claims(world), lambda _: b"")
    status, raw = _whoami(world, token)
    assert status == 401
    assert "token signed with none" in _message(raw)


def test_hs256_signed_with_the_providers_public_key_is_refused(world: World) -> None:
    key = jwt.PyJWK(world.one.jwks()["keys"][0]).key
    pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    for secret in (pem, json.dumps(world.one.jwks()["keys"][0]).encode()):
        token = _forged({"alg": "HS256", "typ": "JWT"}, _claims(world),
                        lambda data, s=secret: hmac.new(s, data, hashlib.sha256).digest())
        status, raw = _whoami(world, token)
        assert status == 401
        assert "token signed with HS256" in _message(raw)


def test_a_token_for_another_audience_is_refused(world: World) -> None:
    token = world.one.id_token("frank", client_id="another-app", claims={"email": "f@example.com",
                                                                           "email_verified": True})
    status, raw = _whoami(world, token)
    assert status == 401
    assert "audience" in _message(raw) and "another-app" in _message(raw)


def test_another_issuers_token_is_not_accepted_as_this_issuers(world: World) -> None:
    # Signed by TWO's key, claiming to be ONE's: ONE's keys never verify it.
    honest = _token(world.two, "grace")
    header, _, signature = honest.split(".")
    payload = json.loads(base64.urlsafe_b64decode(honest.split(".")[1] + "=="))
    forged = header + "." + _b64(json.dumps({**payload, "iss": world.one.issuer}).encode()) + "." + signature
    status, raw = _whoami(world, forged)
    assert status == 401
    assert "signature does not verify" in _message(raw)
    # A key of our own under the kid ONE publishes: still not ONE's key.
    attacker = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    kid = world.one.jwks()["keys"][0]["kid"]
    token = jwt.encode(_claims(world), attacker, algorithm="RS256", headers={"kid": kid})
    status, raw = _whoami(world, token)
    assert status == 401
    assert "signature does not verify" in _message(raw)


def test_an_unknown_issuer_is_named(world: World) -> None:
    attacker = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = jwt.encode(_claims(world, iss="https://evil.example"), attacker, algorithm="RS256")
    status, raw = _whoami(world, token)
    assert status == 401
    assert "token issuer 'https://evil.example' is not configured" in _message(raw)


@pytest.mark.parametrize("sub", ["system:admin", "system:serviceaccount:kube-system:default"])
def test_system_user_names_are_refused_by_the_issuers_rules(world: World, sub: str) -> None:
    status, raw = _whoami(world, _token(world.two, sub))
    assert status == 401
    assert _message(raw) == "user validation rule failed: username cannot used reserved system: prefix"


def test_system_groups_are_refused_by_the_issuers_rules(world: World) -> None:
    status, raw = _whoami(world, _token(world.two, "henry", groups=["dev", "system:nodes"]))
    assert status == 401
    assert _message(raw) == "user validation rule failed: groups cannot used reserved system: prefix"


def test_system_masters_from_a_provider_is_refused_whatever_the_rules(world: World) -> None:
    # ONE has no system: rule (kube-apiserver would take the group): the gateway never does.
    token = _token(world.one, "ivy", groups=["dev", "system:masters"])
    status, raw = world.gw.call("GET", f"/tunnels/clusters/{VIEWED}/api/v1/namespaces", token=token)
    assert status == 401, raw
    assert _message(raw).startswith("group system:masters is never accepted from an identity provider")
    assert not [r for r in world.api.requests.snapshot() if "system:masters" in r.headers.getlist("Impersonate-Group")]


def test_claim_and_user_rules_are_enforced(world: World) -> None:
    status, raw = _whoami(world, _token(world.one, "ivan", email_verified=False))
    assert status == 401
    assert "the email must be verified" in _message(raw)
    status, raw = _whoami(world, _token(world.one, "blocked-judy"))
    assert status == 401
    assert "this user is blocked" in _message(raw)


def test_an_expired_token_is_refused_even_while_its_identity_is_cached(world: World) -> None:
    token = _token(world.two, "kate")
    status, raw = _whoami(world, token)
    assert status == 200, raw  # verified once: now in the identity cache
    exp = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))["exp"]
    assert wait_until(lambda: time.time() > exp + 0.5, timeout=SHORT_LIFE + 30)
    status, raw = world.gw.call("GET", f"/tunnels/clusters/{VIEWED}/api/v1/namespaces", token=token)
    assert status == 401
    message = _message(raw)
    assert "token expired at" in message and "run bcs-middleware login" in message


def test_key_rotation_at_the_provider_is_followed(world: World) -> None:
    before = _token(world.one, "leo", groups=["dev"])
    assert _whoami(world, before)[0] == 200
    world.one.rotate_key()
    after = _token(world.one, "leo", groups=["dev"])
    # The new key is fetched on the first token it does not know (at most once per interval).
    assert wait_until(lambda: _whoami(world, after)[0] == 200, timeout=60, step=0.5)


def test_a_group_holds_cluster_permissions_granted_through_the_api(world: World) -> None:
    path = f"/rest/clusters/{OTHER}/group_permissions/ops"
    token = _token(world.one, "olga", groups=["ops"])
    assert world.gw.call("GET", f"/tunnels/clusters/{OTHER}/api/v1/namespaces", token=token)[0] == 404
    status, raw = world.gw.call("PUT", path, body={"permission": "view"})
    assert status == 201, raw
    try:
        # Cluster permissions are cached per worker for cluster_cache_ttl: poll.
        assert wait_until(lambda: world.gw.call("GET", f"/tunnels/clusters/{OTHER}/api/v1/namespaces",
                                                token=token)[0] == 200, timeout=30, step=0.2)
        seen = world.api.requests.last("/api/v1/namespaces")
        assert seen is not None and seen.headers.getlist("Impersonate-Group") == ["system:authenticated", "ops"]
        # view is not edit: managing the cluster is refused.
        assert world.gw.call("GET", f"/rest/clusters/{OTHER}/permissions", token=token)[0] == 403
        assert world.gw.call("PUT", path, body={"permission": "edit"})[0] == 200
        assert wait_until(lambda: world.gw.call("GET", f"/rest/clusters/{OTHER}/permissions",
                                                token=token)[0] == 200, timeout=30, step=0.2)
    finally:
        assert world.gw.call("DELETE", path)[0] == 200
    assert wait_until(lambda: world.gw.call("GET", f"/tunnels/clusters/{OTHER}/api/v1/namespaces",
                                            token=token)[0] == 404, timeout=30, step=0.2)


def test_a_subscription_grant_to_a_provider_group_is_bound_on_the_cluster_for_its_members_only(
    world: World,
) -> None:
    # A cluster of its own whose fake enforces RBAC from the bindings the subscription writes.
    cluster, pods = "BCS-K8S-OIDC3", "/api/v1/namespaces/default/pods"
    before = world.grants.read_text()
    with FakeAPIServer(token=SA_TOKEN) as api:
        api.authorize(rbac_authorizer(api))
        api.create("pods", {"metadata": {"name": "web", "namespace": "default"},
                            "spec": {"containers": [{"name": "c", "image": "nginx"}]}})
        register_cluster(world.gw, cluster, server_url=api.url, ca_pem=api.ca_pem)
        member = _token(world.one, "sven", groups=["sre"])
        outsider = _token(world.one, "tess", groups=["qa"])
        grants = json.loads(before)["grants"] + [
            {"group": "sre", "cluster": cluster, "namespace": "default", "role": "view"}]
        world.grants.write_text(json.dumps({"version": 1, "grants": grants}))
        qa = f"/rest/clusters/{cluster}/group_permissions/qa"
        try:
            # The gateway's background subscription writes the binding to the cluster.
            assert wait_until(lambda: any(b["metadata"]["name"] == "bcs:group:sre:view" for b in api.bindings),
                              timeout=60, step=0.2)
            binding = api.store.get("rolebindings", "default", "bcs:group:sre:view")
            assert binding["subjects"] == [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io",
                                            "name": "sre"}]
            tunnel = f"/tunnels/clusters/{cluster}{pods}"
            assert wait_until(lambda: world.gw.call("GET", tunnel, token=member)[0] == 200, timeout=30, step=0.2)
            status, raw = world.gw.call("GET", tunnel, token=member)
            assert status == 200, raw
            assert [p["metadata"]["name"] for p in json.loads(raw)["items"]] == ["web"]
            seen = api.requests.last(pods, "GET")
            assert seen is not None and seen.headers.get("Impersonate-User") == "one:sven"
            assert seen.headers.getlist("Impersonate-Group") == ["system:authenticated", "sre"]
            # view in "default" only: the cluster's RBAC refuses the rest.
            status, raw = world.gw.call("POST", tunnel, token=member, body={
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "evil", "namespace": "default"},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]}})
            assert status == 403 and json.loads(raw)["kind"] == "Status", raw
            status, _ = world.gw.call("GET", f"/tunnels/clusters/{cluster}/api/v1/namespaces/kube-system/pods",
                                      token=member)
            assert status == 403

            # Outside the group: the gateway shows no such cluster…
            assert world.gw.call("GET", tunnel, token=outsider)[0] == 404
            # …and let through by a gateway permission of their own group, the cluster says no.
            assert world.gw.call("PUT", qa, body={"permission": "view"})[0] == 201
            # (cluster permissions are cached per worker for cluster_cache_ttl: poll until each has seen it)
            answers: list[tuple[int, bytes]] = []
            assert wait_until(lambda: answers.append(world.gw.call("GET", tunnel, token=outsider))
                              or answers[-1][0] != 404, timeout=30, step=0.2)
            assert wait_until(lambda: answers.append(world.gw.call("GET", tunnel, token=outsider))
                              or all(s != 404 for s, _ in answers[-4:]), timeout=30, step=0.2)
            assert {status for status, _ in answers[-4:]} == {403}, answers[-4:]
            assert json.loads(answers[-1][1])["reason"] == "Forbidden"
            seen = api.requests.last(pods, "GET")
            assert seen is not None and seen.headers.getlist("Impersonate-Group") == ["system:authenticated", "qa"]
        finally:
            world.gw.call("DELETE", qa)
            world.grants.write_text(before)
            world.gw.call("DELETE", f"/rest/clusters/{cluster}")


@pytest.mark.parametrize("group", ["system:authenticated", "system:masters"])
def test_system_groups_cannot_be_granted(world: World, group: str) -> None:
    status, raw = world.gw.call("PUT", f"/rest/clusters/{OTHER}/group_permissions/{group}",
                                body={"permission": "view"})
    assert status == 400, raw
    assert world.gw.call("GET", f"/rest/clusters/{OTHER}/group_permissions")[1] == b"[]"


def test_a_provider_user_registers_no_cluster_of_their_own(world: World) -> None:
    token = _token(world.one, "paul", groups=["dev"])
    status, raw = world.gw.call("POST", "/rest/clusters/bcs", token=token,
                                body={"id": "BCS-K8S-PAUL", "project_id": "p", "cluster_type": "k8s"})
    assert status == 403, raw
    assert json.loads(raw)["code_name"] == "CLUSTER_CREATION_FORBIDDEN"


def test_whoami_says_who_how_and_until_when(world: World) -> None:
    token = _token(world.one, "quinn", groups=["dev", "qa"])
    exp = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))["exp"]
    me = world.gw.json("GET", "/rest/whoami", token=token)
    assert me == {"user_name": "one:quinn", "uid": "uid-quinn", "groups": ["dev", "qa"],
                  "extra": {"example.com/email": ["quinn@example.com"]}, "is_superuser": False,
                  "authenticated_by": "oidc", "expires_at": exp}
    admin = world.gw.json("GET", "/rest/whoami")
    assert admin["authenticated_by"] == "token" and admin["expires_at"] is None and admin["is_superuser"]


def test_a_provider_that_hangs_never_holds_up_another_issuers_tokens(world: World) -> None:
    attacker = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    hung_token = jwt.encode(_claims(world, iss=world.hung), attacker, algorithm="RS256")
    answers: list[tuple[int, bytes, float]] = []

    def hung_request() -> None:
        started = time.monotonic()
        status, raw = _whoami(world, hung_token)
        answers.append((status, raw, time.monotonic() - started))

    waiting = [threading.Thread(target=hung_request) for _ in range(4)]
    for thread in waiting:
        thread.start()
    try:
        ok = _token(world.one, "rita", groups=["dev"])
        for _ in range(5):  # while the hung issuer's keys are being fetched
            started = time.monotonic()
            assert _whoami(world, ok)[0] == 200
            assert time.monotonic() - started < 5
    finally:
        for thread in waiting:
            thread.join(60)
    assert len(answers) == 4
    for status, raw, took in answers:
        # oidc.go: a JWT authenticator that cannot verify (its provider unreachable) is an
        # authentication error, so kube-apiserver answers 401; the message says why.
        assert status == 401, raw
        assert f"cannot verify the token now: issuer {world.hung}: fetching the discovery document timed out" \
            in _message(raw)
        assert took < 30


def test_kubectl_says_that_a_provider_that_is_down_cannot_be_reached(world: World, tmp_path: Path) -> None:
    attacker = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = jwt.encode(_claims(world, iss=world.down), attacker, algorithm="RS256")
    kubeconfig = write_kubeconfig(tmp_path / "down.kubeconfig", server=f"{world.gw.url}/tunnels/clusters/{VIEWED}",
                                  token=token, ca_file=world.gw.ca_file)
    started = time.monotonic()
    got = kubectl("get", "pods", "-n", "default", kubeconfig=kubeconfig)
    assert got.returncode == 1
    # kubectl's discovery drops a 401 Status's message; it prints the Warning header carrying it.
    assert f'Warning: cannot verify the token now: issuer {world.down}: fetching the discovery document failed' \
        in got.stderr, got.stderr
    assert "(the identity provider cannot be reached: your sign-in may be fine, try again shortly)" in got.stderr
    assert "error: You must be logged in to the server" in got.stderr
    assert time.monotonic() - started < 20  # refused connections fail at once; no hang
    assert token not in got.stderr
    # Another issuer's tokens work all the while.
    assert _whoami(world, _token(world.one, "uma", groups=["dev"]))[0] == 200


@contextmanager
def _claim_source(ca: trustme.CA, answer: str, access_token: str) -> Iterator[tuple[str, list[str]]]:
    """An HTTPS endpoint on loopback answering ``answer`` to a GET bearing ``access_token``; yields its URL
    and the Authorization headers it received."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            ok = self.headers.get("Authorization") == f"Bearer {access_token}"
            body = answer.encode() if ok else b"no"
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "application/jwt")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/groups", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_distributed_groups_claim_is_fetched_verified_and_mapped(world: World) -> None:
    # The groups live at a claim source (OpenID Connect Core §5.6.2); its answer is a JWT of ONE's.
    answer = _token(world.one, "wes", groups=["dist-team", "dev"])
    with _claim_source(world.ca, answer, "source-token-1") as (url, seen):
        token = _token(world.one, "wes", _claim_names={"groups": "src1"},
                       _claim_sources={"src1": {"endpoint": url, "access_token": "source-token-1"}})
        me = world.gw.json("GET", "/rest/whoami", token=token)
        assert me["user_name"] == "one:wes" and me["groups"] == ["dist-team", "dev"]
        assert seen == ["Bearer source-token-1"]
        status, raw = world.gw.call("GET", f"/tunnels/clusters/{VIEWED}/api/v1/namespaces", token=token)
        assert status == 200, raw  # "dev" came from the source: the subscription's group grant applies
        # A wrong access token: the source refuses, and so is the token (never without its groups).
        refused = _token(world.one, "wes", _claim_names={"groups": "src1"},
                         _claim_sources={"src1": {"endpoint": url, "access_token": "wrong"}})
        status, raw = _whoami(world, refused)
        assert status == 401
        assert _message(raw) == ("could not expand distributed claims: groups claim source at 127.0.0.1 "
                                 "answered HTTP 401")
    # A source answering a token it signed itself: not an issuer's, refused.
    attacker = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = jwt.encode(_claims(world, groups=["platform-admins"]), attacker, algorithm="RS256",
                        headers={"kid": world.one.jwks()["keys"][0]["kid"]})
    with _claim_source(world.ca, forged, "t") as (url, _):
        token = _token(world.one, "xan", _claim_names={"groups": "src1"},
                       _claim_sources={"src1": {"endpoint": url, "access_token": "t"}})
        status, raw = _whoami(world, token)
        assert status == 401
        assert _message(raw) == ("could not expand distributed claims: "
                                 "token signature does not verify with the issuer's keys")
    # Plain http never carries an access token.
    token = _token(world.one, "yara", _claim_names={"groups": "src1"},
                   _claim_sources={"src1": {"endpoint": "http://127.0.0.1:9/groups", "access_token": "t"}})
    status, raw = _whoami(world, token)
    assert status == 401
    assert _message(raw) == "could not expand distributed claims: the groups claim source is not an https URL"


def _cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False)


def test_login_with_pkce_then_kubectl_through_the_exec_plugin(world: World, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    config, kubeconfig = tmp_path / "bcs" / "config.json", tmp_path / "kubeconfig"
    monkeypatch.setenv("BCS_CONFIG", str(config))  # the exec plugin kubectl starts reads it too
    for name in ("BCS_TOKEN", "BCS_SERVER", "BCS_CA_FILE"):
        monkeypatch.delenv(name, raising=False)
    env = {**os.environ, "HOME": str(tmp_path), "BCS_OIDC_CLIENT_SECRET": "any"}
    dev = _token(world.one, "sam-probe", groups=["dev"])  # the subscription's group grant is read in the background
    assert wait_until(lambda: VIEWED.encode() in _whoami(world, dev)[1], timeout=30, step=0.2)
    world.one.set_user("sam", {"email": "sam@example.com", "email_verified": True, "groups": ["dev"]})
    login = subprocess.Popen(
        [CLI, "login", "--server", world.gw.url, "--ca-file", world.gw.ca_file, "--issuer", world.one.issuer,
         "--issuer-ca-file", world.one.ca_file, "--client-id", AUDIENCE, "--no-browser",
         "--kubeconfig", str(kubeconfig), "-o", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert login.stderr is not None
        url = ""
        deadline = time.monotonic() + 60
        while not url.startswith("https://") and time.monotonic() < deadline:
            url = login.stderr.readline().strip()
        # The person's browser: the provider's form, then the redirect to the CLI's loopback listener.
        parts = urlsplit(url)
        assert parse_qs(parts.query)["code_challenge_method"] == ["S256"]
        status, headers, _ = world.one.request("POST", f"{parts.path}?{parts.query}", body=b"sub=sam",
                                               headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert status == 302
        assert headers["Location"].startswith("http://127.0.0.1:")
        with urllib.request.urlopen(headers["Location"], timeout=30) as answer:
            assert answer.status == 200
        out, err = login.communicate(timeout=60)
    finally:
        if login.poll() is None:
            login.kill()
    assert login.returncode == 0, err
    result = json.loads(out)
    assert result["user"] == "one:sam" and result["groups"] == "dev"
    assert f"bcs-{VIEWED}" in result["contexts"] and f"bcs-{OTHER}" not in result["contexts"]
    stored = config.with_name("oidc.json")
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600 and json.loads(stored.read_text())["refresh_token"]
    written = kubeconfig.read_text()
    assert "token:" not in written and "eyJ" not in written  # no token in the kubeconfig: an exec plugin

    got = kubectl("--context", f"bcs-{VIEWED}", "get", "pods", "-n", "default", kubeconfig=kubeconfig)
    assert got.returncode == 0, got.stderr
    seen = world.api.requests.last("/api/v1/namespaces/default/pods")
    assert seen is not None and seen.headers.get("Impersonate-User") == "one:sam"
    refused = kubectl("--context", f"bcs-{VIEWED}", "get", "pods", "-n", "default", "--as", "one:root",
                      kubeconfig=kubeconfig)
    assert refused.returncode != 0

    credential = json.loads(_cli("credential", env=env).stdout)
    assert credential["apiVersion"] == "client.authentication.k8s.io/v1" and credential["kind"] == "ExecCredential"
    assert credential["status"]["token"].startswith("eyJ") and credential["status"]["expirationTimestamp"].endswith("Z")
    me = json.loads(_cli("whoami", "-o", "json", env=env).stdout)
    assert me["user_name"] == "one:sam" and me["authenticated_by"] == "oidc" and me["groups"] == "dev"

    # Near expiry the plugin refreshes silently: a new ID token, kept, handed to kubectl.
    kept = json.loads(stored.read_text())
    stored.write_text(json.dumps({**kept, "expires_at": time.time() + 5}))
    got = kubectl("--context", f"bcs-{VIEWED}", "get", "pods", "-n", "default", kubeconfig=kubeconfig)
    assert got.returncode == 0, got.stderr
    renewed = json.loads(stored.read_text())
    assert renewed["id_token"] != kept["id_token"] and renewed["expires_at"] > time.time() + 600
    # A refresh the provider refuses ends the session with a clear word.
    stored.write_text(json.dumps({**renewed, "expires_at": time.time() + 5, "refresh_token": "revoked"}))
    refused_refresh = _cli("credential", env=env)
    assert refused_refresh.returncode != 0
    assert "the identity provider refused: invalid_grant" in refused_refresh.stderr

    out = _cli("logout", "--kubeconfig", str(kubeconfig), "-o", "json", env=env)
    assert out.returncode == 0, out.stderr
    assert not stored.exists()
    assert f"bcs-{VIEWED}" not in kubeconfig.read_text()
    assert _cli("credential", env=env).returncode != 0
