"""``UpstreamProxy`` under a real gunicorn, in front of a real (fake) upstream, over sockets."""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.apps.conftest import TRUSTED_CLIENT
from tests.apps.routed_app import encode_upstream
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import ServerProcess, free_port

MiB = 1024 * 1024


def _echo(server: ServerProcess, path: str = "/echo", **kwargs: object) -> dict:
    resp = requests.get(server.url + path, timeout=10, **kwargs)  # type: ignore[arg-type]
    assert resp.status_code == 200, resp.text
    return resp.json()


def _headers(echo: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, value in echo["headers"]:
        out.setdefault(name.lower(), []).append(value)
    return out


def _pattern(total: int, piece: int = MiB) -> Iterator[bytes]:
    block = hashlib.sha256(b"seed").digest() * (piece // 32)
    left = total
    while left:
        out = block[: min(piece, left)]
        left -= len(out)
        yield out


def _sha(total: int) -> str:
    digest = hashlib.sha256()
    for piece in _pattern(total):
        digest.update(piece)
    return digest.hexdigest()


# -- plain pass-through -----------------------------------------------------------------------


def test_get_keeps_path_query_and_encoded_slashes(proxy: ServerProcess) -> None:
    echo = _echo(proxy, "/echo/a%2Fb/c?x=1&y=%20z")
    assert echo["method"] == "GET"
    assert echo["path"] == "/echo/a%2Fb/c"
    assert echo["query"] == "x=1&y=%20z"


def test_post_body_with_content_length_arrives_intact(proxy: ServerProcess) -> None:
    body = b"".join(_pattern(3 * MiB + 17))
    resp = requests.post(proxy.url + "/digest", data=body, timeout=20)
    assert resp.json() == {"bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}


def test_chunked_upload_arrives_intact(proxy: ServerProcess, fake: FakeUpstream) -> None:
    total = 5 * MiB + 3
    resp = requests.post(proxy.url + "/digest", data=_pattern(total, 100_000), timeout=30)
    assert resp.json() == {"bytes": total, "sha256": _sha_of(_pattern(total, 100_000))}
    recorded = fake.last("/digest")
    assert recorded.header("Transfer-Encoding") == "chunked"
    assert recorded.header("Content-Length") is None


def _sha_of(pieces: Iterator[bytes]) -> str:
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece)
    return digest.hexdigest()


@pytest.mark.parametrize(
    "chunked", [pytest.param(False, id="sized"), pytest.param(True, id="chunked")]
)
def test_large_download_streams_intact(proxy: ServerProcess, chunked: bool) -> None:
    size = 20 * MiB + 5
    flag = "&chunked=1" if chunked else ""
    with requests.get(f"{proxy.url}/download?bytes={size}{flag}", stream=True, timeout=30) as resp:
        assert resp.status_code == 200
        assert (resp.headers.get("Content-Length") is None) == chunked
        digest = hashlib.sha256()
        got = 0
        for piece in resp.iter_content(MiB):
            got += len(piece)
            digest.update(piece)
    block = bytes(range(256)) * 256
    expected = hashlib.sha256()
    left = size
    while left:
        expected.update(block[: min(len(block), left)])
        left -= min(len(block), left)
    assert got == size
    assert digest.hexdigest() == expected.hexdigest()


def test_redirect_is_returned_not_followed(proxy: ServerProcess, fake: FakeUpstream) -> None:
    before = len(fake.requests)
    resp = requests.get(proxy.url + "/redirect", allow_redirects=False, timeout=10)
    assert resp.status_code == 302
    assert resp.headers["Location"] == "/echo"
    assert len(fake.requests) == before + 1


# -- headers ----------------------------------------------------------------------------------


def test_client_authorization_and_impersonation_are_never_forwarded(proxy: ServerProcess) -> None:
    headers = {
        "Authorization": "Bearer client-secret-token",
        "Impersonate-User": "admin",
        "impersonate-group": "system:masters",
        "X-Kept": "yes",
    }
    seen = _headers(_echo(proxy, headers=headers))
    assert "authorization" not in seen
    assert not [name for name in seen if name.startswith("impersonate-")]
    assert seen["x-kept"] == ["yes"]
    assert seen["host"] == [f"127.0.0.1:{proxy.url.rsplit(':', 1)[1]}"] or seen["host"]


def test_hop_by_hop_request_headers_are_dropped(proxy: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(
            b"GET /echo HTTP/1.1\r\nHost: example.test\r\n"
            b"Connection: keep-alive, X-Private\r\nX-Private: hop\r\nKeep-Alive: timeout=5\r\n"
            b"TE: trailers\r\nProxy-Authorization: Basic c2VjcmV0\r\nX-End: kept\r\n"
            b"Connection: close\r\n\r\n"
        )
        raw = _read_all(sock)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    seen = _headers(json.loads(_dechunk(head, body)))
    for name in ("x-private", "keep-alive", "te", "proxy-authorization", "connection"):
        assert name not in seen, name
    assert seen["x-end"] == ["kept"]


def test_hop_by_hop_response_headers_are_dropped(proxy: ServerProcess) -> None:
    resp = requests.get(proxy.url + "/hop", timeout=10)
    assert resp.status_code == 200
    assert resp.headers["X-End-To-End"] == "kept"
    for name in ("X-Hop-Secret", "Keep-Alive", "Proxy-Authenticate", "Upgrade"):
        assert name not in resp.headers, name


@pytest.mark.parametrize(
    ("source", "expected_for", "expected_proto", "expected_host"),
    [
        pytest.param("127.0.0.1", "127.0.0.1", "http", "front.test", id="untrusted-client"),
        pytest.param(TRUSTED_CLIENT, f"203.0.113.9, {TRUSTED_CLIENT}", "https", "public.test",
                     id="trusted-proxy"),
    ],
)
def test_x_forwarded_headers_follow_trusted_proxies(
    proxy: ServerProcess, source: str, expected_for: str, expected_proto: str, expected_host: str
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10,
                                      source_address=(source, 0))
    try:
        conn.request("GET", "/echo", headers={
            "Host": "front.test",
            "X-Forwarded-For": "203.0.113.9",
            "X-Forwarded-Proto": "https",
            "X-Forwarded-Host": "public.test",
            "X-Forwarded-Prefix": "/evil",
        })
        resp = conn.getresponse()
        seen = _headers(json.loads(resp.read()))
    finally:
        conn.close()
    assert seen["x-forwarded-for"] == [expected_for]
    assert seen["x-forwarded-proto"] == [expected_proto]
    assert seen["x-forwarded-host"] == [expected_host]
    assert ("x-forwarded-prefix" in seen) == (source == TRUSTED_CLIENT)


# -- streaming, pooling, disconnects ----------------------------------------------------------


def test_streamed_lines_arrive_one_at_a_time(proxy: ServerProcess) -> None:
    lines, delay = 5, 0.4
    arrivals: list[tuple[float, dict]] = []
    with requests.get(f"{proxy.url}/stream?lines={lines}&delay={delay}", stream=True,
                      timeout=10) as resp:
        assert resp.status_code == 200
        assert "Content-Length" not in resp.headers
        for line in resp.iter_lines(chunk_size=1):
            if line:
                arrivals.append((time.time(), json.loads(line)))
    assert [item["line"] for _, item in arrivals] == list(range(lines))
    first_arrived = arrivals[0][0]
    last_sent = arrivals[-1][1]["sent"]
    # The first event reached the client long before the upstream sent the last one.
    assert first_arrived < last_sent - delay * (lines - 2)
    for arrived, item in arrivals:
        assert arrived - item["sent"] < delay * 1.5


def test_upstream_connections_are_reused(proxy: ServerProcess, fake: FakeUpstream) -> None:
    _echo(proxy)  # warm: the worker's pool holds a connection now
    before = fake.accepted
    with requests.Session() as session:
        for _ in range(200):
            assert session.get(proxy.url + "/echo", timeout=10).status_code == 200
    # One sequential client needs at most one upstream connection.
    assert fake.accepted - before <= 1


def test_client_disconnect_mid_stream_frees_upstream_connection(
    proxy: ServerProcess, fake: FakeUpstream
) -> None:
    ended_before = len(fake.state.stream_ended)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(b"GET /stream?lines=200&delay=0.05 HTTP/1.1\r\nHost: t\r\n\r\n")
        received = b""
        deadline = time.monotonic() + 10
        while received.count(b'"line"') < 2 and time.monotonic() < deadline:
            received += sock.recv(4096)
        assert received.count(b'"line"') >= 2
    disconnected = time.monotonic()
    ended = fake.wait_stream_ended(ended_before + 1, timeout=10)
    assert ended[ended_before:] == ["aborted"]
    # 200 lines at 0.05 s would take 10 s: the upstream saw the close well before.
    assert time.monotonic() - disconnected < 5


def test_100_mib_upload_leaves_worker_memory_flat(proxy: ServerProcess) -> None:
    worker = _worker_pid(proxy)
    requests.post(proxy.url + "/digest", data=b"x" * MiB, timeout=10)  # warm the worker
    before = _vm_kib(worker, "VmRSS")
    total = 100 * MiB
    resp = requests.post(proxy.url + "/digest", data=_pattern(total), timeout=120)
    assert resp.json() == {"bytes": total, "sha256": _sha(total)}
    peak = _vm_kib(worker, "VmHWM")
    assert (peak - before) < 32 * 1024, f"worker peak RSS grew by {(peak - before) // 1024} MiB"


def _worker_pid(server: ServerProcess) -> int:
    pid = server.proc.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert len(children) == 1
    return int(children[0])


def _vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


# -- routed upstreams (bcs.upstream set by an earlier layer) -----------------------------------


def _routed(routed: ServerProcess, path: str = "/echo", style: str | None = None,
            timeout: float = 10, client_headers: dict[str, str] | None = None, superuser: bool = False,
            **upstream: object) -> requests.Response:
    headers = {"X-Test-Upstream": encode_upstream(path=path, **upstream),
               "Authorization": "Bearer client-token", **(client_headers or {})}
    if superuser:
        headers["X-Test-Superuser"] = "1"
    if style:
        headers["X-Test-Error-Style"] = style
    return requests.get(routed.url + "/anything", headers=headers, timeout=timeout)


def test_routed_upstream_gets_bearer_token_and_set_headers(
    routed: ServerProcess, fake: FakeUpstream
) -> None:
    resp = _routed(
        routed, "/echo/api/v1/pods", query="watch=1", base_urls=[fake.url],
        bearer_token="sa-token", name="c1",
        set_headers=[["Impersonate-User", "alice"], ["Impersonate-Group", "system:authenticated"],
                     ["Impersonate-Group", "devs"]],
    )
    assert resp.status_code == 200
    echo = resp.json()
    seen = _headers(echo)
    assert echo["path"] == "/echo/api/v1/pods" and echo["query"] == "watch=1"
    assert seen["authorization"] == ["Bearer sa-token"]
    assert seen["impersonate-user"] == ["alice"]
    assert seen["impersonate-group"] == ["system:authenticated", "devs"]


def test_set_headers_replace_the_clients_own(routed: ServerProcess, fake: FakeUpstream) -> None:
    resp = _routed(routed, "/echo", base_urls=[fake.url], name="c1",
                   set_headers=[["X-Tenant", "gateway"]],
                   client_headers={"x-tenant": "forged", "X-Other": "kept"})
    seen = _headers(resp.json())
    assert seen["x-tenant"] == ["gateway"]
    assert seen["x-other"] == ["kept"]


def test_tls_upstream_verified_against_its_ca(routed: ServerProcess, fake_tls: FakeUpstream,
                                              ca) -> None:  # type: ignore[no-untyped-def]
    pem = ca.cert_pem.bytes().decode()
    resp = _routed(routed, base_urls=[fake_tls.url], ca_pem=pem)
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("style", [pytest.param(None, id="json"),
                                   pytest.param("kubernetes", id="kubernetes")])
def test_tls_upstream_with_wrong_ca_is_a_clear_502(routed: ServerProcess, fake_tls: FakeUpstream,
                                                   style: str | None) -> None:
    import trustme

    other = trustme.CA().cert_pem.bytes().decode()
    resp = _routed(routed, base_urls=[fake_tls.url], ca_pem=other, name="c1", style=style,
                   bearer_token="sa-secret", superuser=True)
    assert resp.status_code == 502
    body = resp.json()
    assert "did not verify" in body["message"] and "127.0.0.1" in body["message"]
    assert "sa-secret" not in resp.text
    if style == "kubernetes":
        assert body["kind"] == "Status" and body["code"] == 502
    else:
        assert body["code_name"] == "UPSTREAM_TLS_ERROR"


@pytest.mark.parametrize(
    ("server_name", "status"),
    [pytest.param(None, 502, id="address-name-does-not-match"),
     pytest.param("kubernetes", 200, id="override-matches")],
)
def test_tls_server_name_override(routed: ServerProcess, fake_kubernetes: FakeUpstream, ca,  # type: ignore[no-untyped-def]
                                  server_name: str | None, status: int) -> None:
    resp = _routed(routed, base_urls=[fake_kubernetes.url], ca_pem=ca.cert_pem.bytes().decode(),
                   server_name=server_name)
    assert resp.status_code == status, resp.text


def test_upstream_down_is_502(routed: ServerProcess) -> None:
    resp = _routed(routed, base_urls=[f"http://127.0.0.1:{free_port()}"], name="c-down", superuser=True)
    assert resp.status_code == 502
    assert "cannot connect" in resp.json()["message"]


@pytest.mark.parametrize("cause", ["down", "wrong-ca", "slow"])
def test_anyone_but_a_superuser_reads_one_answer_for_every_upstream_failure(
    routed: ServerProcess, fake: FakeUpstream, fake_tls: FakeUpstream, cause: str
) -> None:
    import trustme

    upstream: dict[str, object] = {
        "down": {"base_urls": [f"http://127.0.0.1:{free_port()}"]},
        "wrong-ca": {"base_urls": [fake_tls.url], "ca_pem": trustme.CA().cert_pem.bytes().decode()},
        "slow": {"base_urls": [fake.url], "path": "/slow", "query": "delay=6"},
    }[cause]
    resp = _routed(routed, name="c1", timeout=15, **upstream)
    assert resp.status_code == 502
    assert resp.json() == {"code_name": "UPSTREAM_UNREACHABLE", "message": "cannot reach the upstream"}


def test_slow_upstream_is_504_within_the_read_timeout(routed: ServerProcess,
                                                      fake: FakeUpstream) -> None:
    started = time.monotonic()
    resp = _routed(routed, "/slow", query="delay=6", base_urls=[fake.url], timeout=15, superuser=True)
    assert resp.status_code == 504
    assert time.monotonic() - started < 5  # read_timeout is 1.5 s in routed_app


def test_failover_to_the_second_address(routed: ServerProcess, fake: FakeUpstream) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    for _ in range(3):
        resp = _routed(routed, base_urls=[down, fake.url])
        assert resp.status_code == 200


def test_no_upstream_at_all_is_a_500_config_error(routed: ServerProcess) -> None:
    resp = requests.get(routed.url + "/x", timeout=10)
    assert resp.status_code == 500
    assert resp.json()["code_name"] == "CONFIG_ERROR"


# -- raw HTTP helpers -------------------------------------------------------------------------


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        piece = sock.recv(65536)
        if not piece:
            break
        data += piece
    return data


def _dechunk(head: bytes, body: bytes) -> bytes:
    if b"transfer-encoding: chunked" not in head.lower():
        return body
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2:]
    return out

