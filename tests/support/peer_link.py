"""Stand-ins and raw clients for the peer link (``bcs_middleware.agent_tunnel.peer_link``).

:class:`StandInAgents` is what the peer listener and the router use of ``LocalAgents``:
its "agent streams" are TCP connections to a local server (an echo server, a fake
apiserver), so the link can be driven without an agent. :class:`RawPeer` speaks the
link's protocol by hand, to send what a real client never would.
"""

from __future__ import annotations

import json
import secrets
import socket
import ssl

from bcs_middleware.agent_tunnel.peer_link import GREETING, request_mac
from bcs_middleware.core.records import Holder
from bcs_middleware.pki.certificates import cert_fingerprint
from tests.support.servers import ConnectionServer


class StandInAgents:
    """Holds ``clusters``; a stream for one of them is a TCP connection to ``127.0.0.1:port``."""

    def __init__(self, holder_id: str, port: int, clusters: tuple[str, ...] = (), *, fail: bool = False) -> None:
        self.holder = Holder(holder_id)
        self.port = port
        self.clusters = set(clusters)
        self.fail = fail
        self.opened: list[tuple[str, str]] = []

    def open_local(self, cluster_id: str, address: str, timeout: float) -> socket.socket | None:
        if cluster_id not in self.clusters:
            return None
        if self.fail:
            raise ConnectionResetError("the agent's session ended")
        self.opened.append((cluster_id, address))
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def open_local_stream(self, cluster_id: str, address: str, timeout: float) -> socket.socket | None:
        # A socket even where a memory stream was asked for: the dialer's contract allows it.
        return self.open_local(cluster_id, address, timeout)

    def gone_reason(self, cluster_id: str) -> str | None:
        return None


class RawPeer:
    """A hand-driven TLS connection to a peer listener (no certificate check: the attacker's view)."""

    def __init__(self, port: int, *, timeout: float = 10.0) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        self.sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=timeout))
        #: what an attacker learns from the handshake alone
        self.fingerprint = cert_fingerprint(self.sock.getpeercert(binary_form=True) or b"")
        self.challenge = b""

    def greeting(self) -> bytes:
        data = b""
        while len(data) < len(GREETING) + 32:
            piece = self.sock.recv(len(GREETING) + 32 - len(data))
            if not piece:
                break
            data += piece
        self.challenge = data[len(GREETING):]
        return data

    def credential(self, key: bytes, cluster_id: str, address: str, *, fingerprint: str | None = None,
                   challenge: bytes | None = None) -> bytes:
        """A request line as a real client makes it (``fingerprint``/``challenge`` to forge)."""
        nonce = secrets.token_bytes(32)
        mac = request_mac(key, challenge=self.challenge if challenge is None else challenge, nonce=nonce,
                          fingerprint=fingerprint or self.fingerprint, cluster_id=cluster_id, address=address)
        return json.dumps({"cluster": cluster_id, "address": address, "nonce": nonce.hex(),
                           "mac": mac.hex()}).encode() + b"\n"

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def rest(self, limit: int = 65536) -> bytes:
        """Everything the listener says until it closes (bounded by the socket timeout)."""
        data = b""
        try:
            while len(data) < limit:
                piece = self.sock.recv(limit)
                if not piece:
                    break
                data += piece
        except (ssl.SSLError, ConnectionResetError):
            pass
        return data

    def close(self) -> None:
        self.sock.close()


class QuickAPIServer(ConnectionServer):
    """A TLS HTTP/1.1 server answering every request at once with one small JSON (one write, no Nagle).

    For timing the paths to an apiserver without the server's own latency in the figures.
    """

    BODY = b'{"kind":"Status","apiVersion":"v1","status":"Success"}'

    def __init__(self, tmp: str) -> None:
        import os

        from bcs_middleware.pki.certificates import generate_ca, issue_server_cert

        ca = generate_ca("quick-apiserver-ca")
        leaf = issue_server_cert(ca, ["127.0.0.1", "localhost"])
        cert, key = os.path.join(tmp, "quick.crt"), os.path.join(tmp, "quick.key")
        with open(cert, "wb") as fh:
            fh.write(leaf.cert_pem)
        with open(key, "wb") as fh:
            fh.write(leaf.key_pem)
        self.ca_pem = ca.cert_pem.decode()
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        super().__init__()
        self.url = f"https://127.0.0.1:{self.port}"

    def handle(self, conn: socket.socket) -> None:
        answer = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                  + str(len(self.BODY)).encode() + b"\r\n\r\n" + self.BODY)
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(60)
            with self.context.wrap_socket(conn, server_side=True) as tls:
                pending = b""
                while True:
                    piece = tls.recv(65536)
                    if not piece:
                        return
                    pending += piece
                    while b"\r\n\r\n" in pending:  # bodiless requests (GET)
                        _, _, pending = pending.partition(b"\r\n\r\n")
                        tls.sendall(answer)
        except OSError:
            pass
