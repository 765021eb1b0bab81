"""The peer link: a worker reaches an agent that another worker, or another instance, holds.

An agent's WebSocket lands in one gunicorn worker of one gateway instance, its *holder*
(recorded in the store's ``agent_placements`` with the holder's peer address and
fingerprint). A request for that cluster may arrive at any worker of any instance that
shares the database. The requesting worker does not hand the *request* over — policy
(authentication, impersonation, admission, audit) would then be split over two
processes — it forwards the *dial*: it asks the holder for a byte pipe to the cluster's
apiserver, and runs TLS to the apiserver end to end over that pipe exactly as over a
local agent stream. The holder only copies bytes.

Each worker runs a :class:`~.peer_listener.PeerListener` (a thread; a greenlet under the
gevent worker) on ``peer_address``. A :class:`~.peer_client.PeerClient` speaks to it::

    TLS 1.3 (the holder's self-signed certificate; the requester pins its SHA-256)
    holder    → requester   b"BCSPEER1" + challenge             (32 fresh random bytes)
    requester → holder      {"cluster", "address", "nonce", "mac"}\\n        (≤ 1 KiB)
    holder    → requester   {"ok": true | false, "error"?, "mac"}\\n
    … then raw bytes both ways: the requester's TLS to the apiserver

Security:

* The credential is HMAC-SHA256 under a key derived (HKDF) from the gateway's secret key —
  the one that encrypts credentials at rest, so instances that share a database already
  share it — over the holder's fresh challenge, the requester's nonce, the holder's
  certificate fingerprint, the cluster and the address. A credential is good for one
  connection to one holder: replayed, it meets another challenge; relayed to another
  holder, another fingerprint. It is checked in constant time, against each configured
  key (the first one signs), so the secret key rotates as the store's does.
* The holder answers with its own MAC over the challenge, the nonce and the outcome: the
  requester trusts no answer from a process without the key.
* A peer that does not authenticate gets nothing beyond the greeting: the connection is
  closed without an answer. The listener serves this one request; it speaks no HTTP and
  reaches nothing of the gateway's API.
* Bounded: the handshake (TLS, greeting, request) must complete within
  ``handshake_timeout``; the request line is at most 1 KiB; at most ``max_handshakes``
  unauthenticated and ``max_connections`` connections in all at once (more are closed at
  once); a pipe ends after ``idle_timeout`` without a byte and after ``max_duration``; TCP
  keepalive notices a vanished machine.
* The link stays TLS after the handshake although what it carries is TLS to the apiserver
  already: in the clear, whoever is on the path between two gateway hosts could take over an
  authenticated connection and hold a raw pipe to the cluster's apiserver from outside the
  cluster's network. Dropping to TCP after authentication would spare the requester's pump
  (measured with ``bench/peer_link_bench.py``; figures in bench/README.md) — not worth that.

The requester's side of a pipe is handed to the transport as a real connected socket, one
end of a :func:`socket.socketpair` that a pump (a thread; a greenlet under gevent) splices
to the peer link with :func:`bcs_middleware.core.splice.splice` — the transport wraps
it in TLS, selects and pools it as any socket.

This module holds what both ends share: the protocol's constants and MACs, addresses, the
handshake's deadline-bounded I/O and the TLS contexts; :mod:`.peer_listener` is the holder's
end, :mod:`.peer_client` the requester's.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import ipaddress
import json
import os
import re
import selectors
import socket
import ssl
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..core.errors import ConfigError

GREETING = b"BCSPEER1"
CHALLENGE_SIZE = 32
NONCE_SIZE = 32
_MAX_LINE = 1024
#: A cluster id as the API accepts one (``cluster_create.json``).
_CLUSTER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: ``host:port`` or ``[v6]:port`` of an apiserver, as the transport names it.
_ADDRESS = re.compile(r"^(?:[A-Za-z0-9._-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]):[0-9]{1,5}$")
#: What the peer-link key is derived for (:meth:`bcs_middleware.store.SecretBox.derive`).
PEER_KEY_PURPOSE = b"bcs-middleware peer link v1"

T = TypeVar("T")


class PeerError(Exception):
    """A peer dial failed; :attr:`reason` says how (``unreachable``, ``refused``, ``not_here``, ``unavailable``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _mac(key: bytes, label: bytes, *parts: bytes) -> bytes:
    # Each part length-prefixed: no two different tuples of parts read the same.
    mac = hmac.new(key, label, hashlib.sha256)
    for part in parts:
        mac.update(len(part).to_bytes(4, "big"))
        mac.update(part)
    return mac.digest()


def request_mac(key: bytes, *, challenge: bytes, nonce: bytes, fingerprint: str, cluster_id: str,
                address: str) -> bytes:
    """What a requester presents: bound to this connection, this holder, this cluster and address."""
    return _mac(key, b"bcs-peer-dial", challenge, nonce, fingerprint.encode(), cluster_id.encode(), address.encode())


def answer_mac(key: bytes, *, challenge: bytes, nonce: bytes, outcome: str) -> bytes:
    return _mac(key, b"bcs-peer-answer", challenge, nonce, outcome.encode())


@dataclass(frozen=True)
class PeerAddress:
    """Where a worker's peer listener binds, and what it advertises: a host and a port range.

    ``low == high == 0``: an ephemeral port. A range lets every worker of an instance
    take its own port among a few a firewall opens.
    """

    host: str
    low: int = 0
    high: int = 0

    @classmethod
    def parse(cls, text: str) -> PeerAddress:
        """``HOST``, ``HOST:PORT``, ``HOST:LOW-HIGH`` (``[v6]`` for IPv6); port 0 = ephemeral."""
        text = text.strip()
        host, ports = text, ""
        if text.startswith("["):
            host, sep, rest = text[1:].partition("]")
            if not sep or (rest and not rest.startswith(":")):
                raise ConfigError(f"peer_address: {text!r} is not HOST, HOST:PORT or HOST:LOW-HIGH")
            ports = rest[1:]
        elif text.count(":") == 1:
            host, _, ports = text.partition(":")
        low = high = 0
        if ports:
            lo, _, hi = ports.partition("-")
            try:
                low, high = int(lo), int(hi or lo)
            except ValueError:
                raise ConfigError(f"peer_address: {text!r} has no valid port or port range") from None
            if not (0 <= low <= high <= 65535) or (low == 0 and high != 0):
                raise ConfigError(f"peer_address: {text!r} has no valid port or port range")
        if not host:
            raise ConfigError("peer_address needs a host (the address other workers and instances connect to)")
        try:
            unspecified = ipaddress.ip_address(host).is_unspecified
        except ValueError:
            unspecified = False
        if unspecified:
            raise ConfigError(f"peer_address: {host} is advertised to the other workers and instances; "
                              "name an address of this host they can reach")
        return cls(host, low, high)


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    # A peer machine that vanishes (no RST) is noticed in about a minute, not hours.
    for option, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def close_quietly(sock: socket.socket | None) -> None:
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.close()


class Deadline:
    """Non-blocking socket operations, each retried until one shared deadline (TLS-aware)."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self.sock = sock
        self.end = time.monotonic() + seconds
        self._selector: selectors.BaseSelector | None = None
        sock.setblocking(False)

    def run(self, op: Callable[[], T], want: int = selectors.EVENT_READ) -> T:
        while True:
            try:
                return op()
            except ssl.SSLWantReadError:
                events = selectors.EVENT_READ
            except ssl.SSLWantWriteError:
                events = selectors.EVENT_WRITE
            except (BlockingIOError, InterruptedError):
                events = want
            left = self.end - time.monotonic()
            if left <= 0:
                raise TimeoutError("the peer link handshake timed out")
            if self._selector is None:
                self._selector = selectors.DefaultSelector()
                self._selector.register(self.sock, events)
            else:
                self._selector.modify(self.sock, events)
            self._selector.select(left)

    def send_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            sent = self.run(functools.partial(self.sock.send, view), selectors.EVENT_WRITE)
            view = view[sent:]

    def read_exactly(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            piece = self.run(functools.partial(self.sock.recv, size - len(data)))
            if not piece:
                raise ConnectionResetError("the peer closed the connection")
            data += piece
        return data

    def read_line(self, limit: int = _MAX_LINE) -> bytes:
        """One ``\\n``-terminated line; the other side sends nothing behind it before it is answered."""
        line = b""
        while not line.endswith(b"\n"):
            if len(line) >= limit:
                raise ValueError("line too long")
            piece = self.run(functools.partial(self.sock.recv, limit - len(line)))
            if not piece:
                raise ConnectionResetError("the peer closed the connection")
            line += piece
            if b"\n" in line[:-1]:
                raise ValueError("bytes behind the line")
        return line[:-1]

    def done(self) -> None:
        if self._selector is not None:
            self._selector.close()
        self.sock.setblocking(True)


def server_context(identity_cert: bytes, identity_key: bytes) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    # load_cert_chain reads files only: the key touches the disk (0600, a private temp
    # directory) for the moment it takes to load it.
    with tempfile.TemporaryDirectory(prefix="bcs-peer-") as tmp:
        cert_file, key_file = os.path.join(tmp, "peer.crt"), os.path.join(tmp, "peer.key")
        for path, data in ((cert_file, identity_cert), (key_file, identity_key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        context.load_cert_chain(cert_file, key_file)
    return context


def client_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    # Trust is the pinned fingerprint of the holder's self-signed certificate, checked
    # after the handshake and before a byte is sent (TLS 1.3 proves the key is held).
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def parse_request(line: bytes) -> tuple[str, str, bytes, bytes] | None:
    try:
        fields = json.loads(line)
        cluster_id, address = fields["cluster"], fields["address"]
        nonce, presented = bytes.fromhex(fields["nonce"]), bytes.fromhex(fields["mac"])
    except (ValueError, TypeError, KeyError):
        return None
    if not (isinstance(cluster_id, str) and _CLUSTER_ID.match(cluster_id)
            and isinstance(address, str) and _ADDRESS.match(address)
            and len(nonce) == NONCE_SIZE and len(presented) == hashlib.sha256().digest_size):
        return None
    return cluster_id, address, nonce, presented
