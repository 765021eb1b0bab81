"""An upstream TLS handshake computes in its turn of the worker's loop (``outbound/streams.py``
``handshake_in_turn``, ``core/turns.py``): under gevent the turn is taken once the server's answer
is in and before the handshake is done; every wait is bounded; without gevent no turn is taken.

Under gevent in a process gevent patched, as the gateway's worker is; the server is a real TLS
server on loopback with a certificate of a generated CA. Under load: ``bench/fairness_bench.py``
(bench/README.md, "Upstream handshakes and busy users in their turn").
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import threading

import pytest
import trustme

from bcs_middleware.outbound import streams
from bcs_middleware.outbound.identity import PoolKey

SCRIPT = r"""
from gevent import monkey; monkey.patch_all()
import json, select, socket, ssl, sys
import gevent, gevent.server
from bcs_middleware.outbound import streams
from bcs_middleware.outbound.identity import PoolKey

mode, cert_file, key_file, ca_file = sys.argv[1:5]
server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
server_context.load_cert_chain(cert_file, key_file)

def echo(sock, addr):
    if mode == "silent":  # takes the connection, never answers the hello
        gevent.sleep(30)
        return
    tls = server_context.wrap_socket(sock, server_side=True)
    tls.sendall(tls.recv(16))
    tls.close()

server = gevent.server.StreamServer(("127.0.0.1", 0), echo)
server.start()
client_context = ssl.create_default_context(cafile=ca_file)
wrapped = []

class Recording:
    def wrap_socket(self, sock, **kwargs):
        wrapped.append(client_context.wrap_socket(sock, **kwargs))
        return wrapped[-1]

turns = []

def recorded_turn():
    tls = wrapped[-1]
    turns.append({"answer_in": bool(select.select([tls], [], [], 0)[0]), "done": tls.version() is not None})

streams.wait_turn = recorded_turn
key = PoolKey("https", "127.0.0.1", server.server_port, None, "localhost", True, None)
conn = streams.SocketConnection(socket.create_connection(("127.0.0.1", server.server_port), timeout=5), key)
result = {}
started = gevent.get_hub().loop.now()
try:
    tls_conn = conn.start_tls(Recording(), "localhost", 0.5 if mode == "silent" else 5)
    tls_conn.write(b"ping")
    result["echo"] = tls_conn.read().decode()
    result["version"] = wrapped[-1].version()
except OSError as exc:
    result["error"] = type(exc).__name__
    result["closed"] = wrapped[-1].fileno() == -1
gevent.get_hub().loop.update_now()
result["seconds"] = gevent.get_hub().loop.now() - started
result["turns"] = turns
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    folder = tmp_path_factory.mktemp("handshake-in-turn")
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    cert_file, key_file, ca_file = folder / "cert.pem", folder / "key.pem", folder / "ca.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    return str(cert_file), str(key_file), str(ca_file)


def _under_gevent(mode: str, tls_files: tuple[str, str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode, *tls_files], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_under_gevent_the_turn_comes_once_the_answer_is_in_and_before_the_handshake_is_done(
        tls_files: tuple[str, str, str]) -> None:
    result = _under_gevent("echo", tls_files)
    assert result["turns"] == [{"answer_in": True, "done": False}]
    assert result["echo"] == "ping" and result["version"] == "TLSv1.3"


def test_under_gevent_a_server_that_never_answers_is_given_up_within_the_timeout(
        tls_files: tuple[str, str, str]) -> None:
    result = _under_gevent("silent", tls_files)
    assert result["error"] == "TimeoutError" and result["closed"]  # its descriptor closed, not leaked
    assert result["turns"] == []  # nothing to compute: no turn taken
    assert 0.4 <= result["seconds"] < 3


def test_without_gevent_one_blocking_handshake_and_no_turn(tls_files: tuple[str, str, str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cert_file, key_file, ca_file = tls_files
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert_file, key_file)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def echo_once() -> None:
        sock, _ = listener.accept()
        with server_context.wrap_socket(sock, server_side=True) as tls:
            tls.sendall(tls.recv(16))

    server = threading.Thread(target=echo_once, daemon=True)
    server.start()
    turns: list[str] = []
    monkeypatch.setattr(streams, "wait_turn", lambda: turns.append("turn"))
    key = PoolKey("https", "127.0.0.1", port, None, "localhost", True, None)
    raw = streams.SocketConnection(socket.create_connection(("127.0.0.1", port), timeout=5), key)
    conn = raw.start_tls(ssl.create_default_context(cafile=ca_file), "localhost", 5)
    try:
        conn.write(b"ping")
        assert conn.read() == b"ping"
    finally:
        conn.close()
    assert turns == []
    server.join(10)
    listener.close()
