"""The peer link: a worker reaches an agent that another worker, or another instance, holds.

An agent's WebSocket lands in one gunicorn worker of one gateway instance, its *holder*
(recorded in the store's ``agent_placements`` with the holder's peer address and
fingerprint). A request for that cluster may arrive at any worker of any instance that
shares the database. The requesting worker does not hand the *request* over — policy
(authentication, impersonation, admission, audit) would then be split over two
processes — it forwards the *dial*: it asks the holder for a byte pipe to the cluster's
apiserver, and runs TLS to the apiserver end to end over that pipe exactly as over a
local agent stream. The holder only copies bytes.

Each worker runs a :class:`PeerListener` (a thread; a greenlet under the gevent worker)
on ``peer_address``. A :class:`PeerClient` speaks to it::

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
  (``bench/peer_link_bench.py`` and a plain relay, loopback: a small exchange through the
  pipe costs ~90 µs more than direct, a relay ~0; bulk 180-290 MiB/s against ~530) — not
  worth that.

The requester's side of a pipe is handed to the transport as a real connected socket, one
end of a :func:`socket.socketpair` that a pump (a thread; a greenlet under gevent) splices
to the peer link with :func:`bcs_middleware.apps.upgrade.splice` — the transport wraps
it in TLS, selects and pools it as any socket.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import secrets
import selectors
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ..apps.upgrade import DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_DURATION, splice
from ..core.errors import ConfigError
from ..pki.certificates import cert_fingerprint, self_signed_server_cert

log = logging.getLogger(__name__)

GREETING = b"BCSPEER1"
_CHALLENGE = 32
_NONCE = 32
_MAX_LINE = 1024
#: A cluster id as the API accepts one (``cluster_create.json``).
_CLUSTER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: ``host:port`` or ``[v6]:port`` of an apiserver, as the transport names it.
_ADDRESS = re.compile(r"^(?:[A-Za-z0-9._-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]):[0-9]{1,5}$")
#: What the peer-link key is derived for (:meth:`bcs_middleware.store.SecretBox.derive`).
PEER_KEY_PURPOSE = b"bcs-middleware peer link v1"

T = TypeVar("T")


class LocalDialer(Protocol):
    """This process's agents (:class:`bcs_middleware.agent_tunnel.registry.LocalAgents`)."""

    def open_local(self, cluster_id: str, address: str, timeout: float) -> socket.socket | None: ...


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


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    # A peer machine that vanishes (no RST) is noticed in about a minute, not hours.
    for option, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def _close(sock: socket.socket | None) -> None:
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.close()


class _Deadline:
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


def _server_context(identity_cert: bytes, identity_key: bytes) -> ssl.SSLContext:
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


def _client_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    # Trust is the pinned fingerprint of the holder's self-signed certificate, checked
    # after the handshake and before a byte is sent (TLS 1.3 proves the key is held).
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class PeerListener:
    """A worker's peer listener: authenticated peers get a byte pipe to an agent this worker holds.

    :param keys: the peer-link keys (``SecretBox.derive(PEER_KEY_PURPOSE)``); any of them authenticates.
    :param address: where to bind; the bound address is :attr:`advertised`.
    :param handshake_timeout: seconds for TLS, greeting and request together.
    :param max_connections: connections served at once (handshakes and pipes); more are closed.
    :param max_handshakes: connections not yet authenticated at once; more are closed (peers
        that connect and say nothing cannot take the pipes' room).
    :param idle_timeout: seconds without a byte either way before a pipe is cut.
    :param max_duration: seconds after which a pipe is cut whatever happens.

    :meth:`bind` (any time) then :meth:`start` (in the serving process, after the fork).
    """

    def __init__(
        self,
        *,
        keys: Sequence[bytes],
        address: PeerAddress,
        handshake_timeout: float = 5.0,
        max_connections: int = 8192,
        max_handshakes: int = 128,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        max_duration: float | None = DEFAULT_MAX_DURATION,
    ) -> None:
        if not keys:
            raise ConfigError("the peer listener needs the gateway's secret key")
        self.keys = tuple(keys)
        self.address = address
        self.handshake_timeout = handshake_timeout
        self.idle_timeout = idle_timeout
        self.max_duration = max_duration
        identity = self_signed_server_cert("bcs-middleware peer")
        #: what requesters pin (hex SHA-256 of the certificate), recorded in placements
        self.fingerprint = cert_fingerprint(identity.cert_pem)
        self._context = _server_context(identity.cert_pem, identity.key_pem)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._handshakes = threading.BoundedSemaphore(max_handshakes)
        self._sock: socket.socket | None = None
        self._local: LocalDialer | None = None
        self._closed = threading.Event()
        self._count_lock = threading.Lock()
        #: connections being served (handshakes and pipes)
        self.active = 0
        self.advertised: str | None = None

    def bind(self) -> str:
        """Bind to the first free port of the range; returns the advertised ``host:port``."""
        if self.advertised is not None:
            return self.advertised
        last: OSError | None = None
        infos = socket.getaddrinfo(self.address.host, None, type=socket.SOCK_STREAM)
        family, _, _, _, sockaddr = infos[0]
        for port in range(self.address.low, self.address.high + 1):
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((sockaddr[0], port, *sockaddr[2:]))
                sock.listen(128)
            except OSError as exc:
                sock.close()
                last = exc
                continue
            self._sock = sock
            self.advertised = join_host_port(self.address.host, sock.getsockname()[1])
            return self.advertised
        raise ConfigError(f"peer_address: cannot listen on {self.address.host} ports "
                          f"{self.address.low}-{self.address.high}: {last.strerror if last else 'no port'}")

    def start(self, local: LocalDialer) -> None:
        """Serve peers from a thread (a greenlet under gevent), handing them ``local``'s agents."""
        from ..outbound.addresses import LISTENERS

        self.bind()
        assert self._sock is not None
        self._local = local
        # The gateway must never dial its own listeners as an upstream.
        LISTENERS.note([self._sock.getsockname()])
        self._sock.settimeout(1.0)  # wake to notice close()
        threading.Thread(target=self._accept, name="bcs-peer-listener", daemon=True).start()
        log.info("peer listener on %s (fingerprint %s)", self.advertised, self.fingerprint[:16])

    def close(self) -> None:
        from ..outbound.addresses import LISTENERS

        self._closed.set()
        if self._sock is not None:
            try:
                LISTENERS.forget([self._sock.getsockname()])
            except OSError:  # already closed
                pass
        _close(self._sock)

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._closed.is_set():
            try:
                conn, _addr = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._closed.is_set():
                    return
                time.sleep(0.1)  # EMFILE and the like: do not spin
                continue
            if not self._slots.acquire(blocking=False):
                _close(conn)
                continue
            if not self._handshakes.acquire(blocking=False):
                self._slots.release()
                _close(conn)
                continue
            with self._count_lock:
                self.active += 1
            threading.Thread(target=self._serve, args=(conn,), name="bcs-peer", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        tls: socket.socket | None = None
        stream: socket.socket | None = None
        try:
            try:
                tls, stream = self._handshake(conn)
            finally:
                self._handshakes.release()
            if stream is not None:
                splice(tls, stream, idle_timeout=self.idle_timeout, max_duration=self.max_duration)
        except Exception:  # a broken peer must never take the listener down
            log.debug("peer connection ended", exc_info=True)
        finally:
            _close(stream)
            _close(tls)
            _close(conn)
            with self._count_lock:
                self.active -= 1
            self._slots.release()

    def _handshake(self, conn: socket.socket) -> tuple[socket.socket, socket.socket | None]:
        """TLS, greeting, request; returns the TLS socket and the agent stream (``None``: refused)."""
        _keepalive(conn)
        tls = self._context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        io = _Deadline(tls, self.handshake_timeout)
        try:
            io.run(tls.do_handshake)
            challenge = secrets.token_bytes(_CHALLENGE)
            io.send_all(GREETING + challenge)
            request = _parse_request(io.read_line())
        except (OSError, ValueError):
            return tls, None  # not a peer, or too slow: nothing more is said
        if request is None:
            return tls, None
        cluster_id, address, nonce, presented = request
        key = self._authenticate(presented, challenge=challenge, nonce=nonce, cluster_id=cluster_id, address=address)
        if key is None:
            log.warning("peer link: refused a peer that did not authenticate")
            return tls, None
        stream, outcome = self._open(cluster_id, address, io)
        try:
            answer = {"ok": stream is not None,
                      "mac": answer_mac(key, challenge=challenge, nonce=nonce, outcome=outcome).hex()}
            if stream is None:
                answer["error"] = outcome
            io.send_all(json.dumps(answer).encode() + b"\n")
            io.done()
        except OSError:
            _close(stream)
            return tls, None
        return tls, stream

    def _authenticate(self, presented: bytes, *, challenge: bytes, nonce: bytes, cluster_id: str,
                      address: str) -> bytes | None:
        found = None
        for key in self.keys:  # every key is tried: the time taken does not say which matched
            expected = request_mac(key, challenge=challenge, nonce=nonce, fingerprint=self.fingerprint,
                                   cluster_id=cluster_id, address=address)
            if hmac.compare_digest(expected, presented) and found is None:
                found = key
        return found

    def _open(self, cluster_id: str, address: str, io: _Deadline) -> tuple[socket.socket | None, str]:
        local = self._local
        left = max(io.end - time.monotonic(), 0.1)
        try:
            stream = local.open_local(cluster_id, address, left) if local is not None else None
        except Exception as exc:  # the agent's session ended under us, or refused the stream
            log.info("peer link: the agent of cluster %s could not open a stream: %s", cluster_id,
                     type(exc).__name__)
            return None, "unavailable"
        if stream is None:
            return None, "not_here"
        return stream, "ok"


def _parse_request(line: bytes) -> tuple[str, str, bytes, bytes] | None:
    try:
        fields = json.loads(line)
        cluster_id, address = fields["cluster"], fields["address"]
        nonce, presented = bytes.fromhex(fields["nonce"]), bytes.fromhex(fields["mac"])
    except (ValueError, TypeError, KeyError):
        return None
    if not (isinstance(cluster_id, str) and _CLUSTER_ID.match(cluster_id)
            and isinstance(address, str) and _ADDRESS.match(address)
            and len(nonce) == _NONCE and len(presented) == hashlib.sha256().digest_size):
        return None
    return cluster_id, address, nonce, presented


class PeerClient:
    """Dials through another worker's peer listener; returns a pipe to the agent's apiserver.

    :param key: the current peer-link key (the first of ``SecretBox.derive(PEER_KEY_PURPOSE)``).
    :param connect_timeout: the TCP connect, capped apart from the whole handshake so that a
        holder that is gone is reported within it.
    :param handshake_timeout: TLS, greeting and answer together (a holder that accepts and
        then says nothing, stopped or overloaded).
    """

    def __init__(
        self,
        key: bytes,
        *,
        connect_timeout: float = 1.0,
        handshake_timeout: float = 3.0,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        max_duration: float | None = DEFAULT_MAX_DURATION,
    ) -> None:
        self.key = key
        self.connect_timeout = connect_timeout
        self.handshake_timeout = handshake_timeout
        self.idle_timeout = idle_timeout
        self.max_duration = max_duration
        self._context = _client_context()

    def open(self, peer_address: str, fingerprint: str, cluster_id: str, address: str,
             timeout: float) -> socket.socket:
        """A connected socket whose bytes reach ``address`` through the holder's agent.

        :raises PeerError: the holder is unreachable (``unreachable``), is not who the
            placement says or did not authenticate (``refused``), holds no agent for the
            cluster (``not_here``) or could not open a stream (``unavailable``).
        """
        started = time.monotonic()
        try:
            raw = socket.create_connection(split_host_port(peer_address), timeout=min(timeout, self.connect_timeout))
        except OSError as exc:
            raise PeerError("unreachable", f"cannot connect to {peer_address}: {exc.strerror or type(exc).__name__}") \
                from None
        tls = None
        try:
            _keepalive(raw)
            tls = self._context.wrap_socket(raw, server_side=False, do_handshake_on_connect=False)
            io = _Deadline(tls, max(min(timeout, self.handshake_timeout) - (time.monotonic() - started), 0.05))
            outcome = self._handshake(tls, io, peer_address, fingerprint, cluster_id, address)
            io.done()
        except PeerError:
            _close(tls)
            _close(raw)
            raise
        except (OSError, ValueError) as exc:
            _close(tls)
            _close(raw)
            raise PeerError("unreachable", f"the peer link to {peer_address} failed: {type(exc).__name__}") from None
        if outcome != "ok":
            _close(tls)
            raise PeerError(outcome, f"{peer_address} could not open a stream ({outcome})")
        inner, outer = socket.socketpair()
        threading.Thread(target=self._pump, args=(tls, outer), name="bcs-peer-pump", daemon=True).start()
        return inner

    def _handshake(self, tls: ssl.SSLSocket, io: _Deadline, peer_address: str, fingerprint: str,
                   cluster_id: str, address: str) -> str:
        io.run(tls.do_handshake)
        der = tls.getpeercert(binary_form=True) or b""
        if not hmac.compare_digest(cert_fingerprint(der).encode(), fingerprint.lower().encode()):
            raise PeerError("refused", f"{peer_address} is not the holder the placement names (another certificate)")
        greeting = io.read_exactly(len(GREETING) + _CHALLENGE)
        if not greeting.startswith(GREETING):
            raise PeerError("refused", f"{peer_address} does not speak the peer protocol")
        challenge = greeting[len(GREETING):]
        nonce = secrets.token_bytes(_NONCE)
        mac = request_mac(self.key, challenge=challenge, nonce=nonce, fingerprint=fingerprint.lower(),
                          cluster_id=cluster_id, address=address)
        io.send_all(json.dumps({"cluster": cluster_id, "address": address, "nonce": nonce.hex(),
                                "mac": mac.hex()}).encode() + b"\n")
        try:
            line = io.read_line()
        except ConnectionResetError:
            raise PeerError("refused", f"{peer_address} refused the peer credential") from None
        try:
            answer = json.loads(line)
            outcome = "ok" if answer["ok"] is True else str(answer["error"])
            presented = bytes.fromhex(answer["mac"])
        except (ValueError, TypeError, KeyError):
            raise PeerError("refused", f"{peer_address} answered something else than the peer protocol") from None
        if not hmac.compare_digest(answer_mac(self.key, challenge=challenge, nonce=nonce, outcome=outcome),
                                   presented):
            raise PeerError("refused", f"{peer_address} answered without the peer credential")
        return outcome if outcome in ("ok", "not_here") else "unavailable"

    def _pump(self, tls: socket.socket, outer: socket.socket) -> None:
        try:
            splice(outer, tls, idle_timeout=self.idle_timeout, max_duration=self.max_duration)
        except Exception:  # the pipe ends; the transport sees its socket closed
            log.debug("peer pipe ended", exc_info=True)
        finally:
            _close(outer)
            _close(tls)
