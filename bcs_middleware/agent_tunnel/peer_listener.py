"""The holder's end of the peer link: authenticated peers get a byte pipe to an agent this worker holds.

The protocol, its security and its bounds are described in :mod:`.peer_link`.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import socket
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from ..core.errors import ConfigError
from ..core.splice import DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_DURATION, splice
from ..pki.certificates import cert_fingerprint, self_signed_server_cert
from .peer_link import (
    CHALLENGE_SIZE,
    GREETING,
    Deadline,
    PeerAddress,
    answer_mac,
    close_quietly,
    join_host_port,
    keepalive,
    parse_request,
    request_mac,
    server_context,
)

log = logging.getLogger("bcs_middleware.agent_tunnel.peer_link")


class LocalDialer(Protocol):
    """This process's agents (:class:`bcs_middleware.agent_tunnel.registry.LocalAgents`)."""

    def open_local(self, cluster_id: str, address: str, timeout: float) -> socket.socket | None: ...


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
        self._context = server_context(identity.cert_pem, identity.key_pem)
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
        close_quietly(self._sock)

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
                close_quietly(conn)
                continue
            if not self._handshakes.acquire(blocking=False):
                self._slots.release()
                close_quietly(conn)
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
            close_quietly(stream)
            close_quietly(tls)
            close_quietly(conn)
            with self._count_lock:
                self.active -= 1
            self._slots.release()

    def _handshake(self, conn: socket.socket) -> tuple[socket.socket, socket.socket | None]:
        """TLS, greeting, request; returns the TLS socket and the agent stream (``None``: refused)."""
        keepalive(conn)
        tls = self._context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        io = Deadline(tls, self.handshake_timeout)
        try:
            io.run(tls.do_handshake)
            challenge = secrets.token_bytes(CHALLENGE_SIZE)
            io.send_all(GREETING + challenge)
            request = parse_request(io.read_line())
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
            close_quietly(stream)
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

    def _open(self, cluster_id: str, address: str, io: Deadline) -> tuple[socket.socket | None, str]:
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
