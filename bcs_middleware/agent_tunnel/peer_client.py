"""The requester's end of the peer link: a pipe to an agent's apiserver through the worker that holds it.

The protocol, its security and its bounds are described in :mod:`.peer_link`.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import socket
import ssl
import threading
import time

from ..core.splice import DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_DURATION, splice
from ..pki.certificates import cert_fingerprint
from .peer_link import (
    CHALLENGE_SIZE,
    GREETING,
    NONCE_SIZE,
    Deadline,
    PeerError,
    answer_mac,
    client_context,
    close_quietly,
    keepalive,
    request_mac,
    split_host_port,
)

log = logging.getLogger("bcs_middleware.agent_tunnel.peer_link")


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
        self._context = client_context()

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
            keepalive(raw)
            tls = self._context.wrap_socket(raw, server_side=False, do_handshake_on_connect=False)
            io = Deadline(tls, max(min(timeout, self.handshake_timeout) - (time.monotonic() - started), 0.05))
            outcome = self._handshake(tls, io, peer_address, fingerprint, cluster_id, address)
            io.done()
        except PeerError:
            close_quietly(tls)
            close_quietly(raw)
            raise
        except (OSError, ValueError) as exc:
            close_quietly(tls)
            close_quietly(raw)
            raise PeerError("unreachable", f"the peer link to {peer_address} failed: {type(exc).__name__}") from None
        if outcome != "ok":
            close_quietly(tls)
            raise PeerError(outcome, f"{peer_address} could not open a stream ({outcome})")
        inner, outer = socket.socketpair()
        threading.Thread(target=self._pump, args=(tls, outer), name="bcs-peer-pump", daemon=True).start()
        return inner

    def _handshake(self, tls: ssl.SSLSocket, io: Deadline, peer_address: str, fingerprint: str,
                   cluster_id: str, address: str) -> str:
        io.run(tls.do_handshake)
        der = tls.getpeercert(binary_form=True) or b""
        if not hmac.compare_digest(cert_fingerprint(der).encode(), fingerprint.lower().encode()):
            raise PeerError("refused", f"{peer_address} is not the holder the placement names (another certificate)")
        greeting = io.read_exactly(len(GREETING) + CHALLENGE_SIZE)
        if not greeting.startswith(GREETING):
            raise PeerError("refused", f"{peer_address} does not speak the peer protocol")
        challenge = greeting[len(GREETING):]
        nonce = secrets.token_bytes(NONCE_SIZE)
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
            close_quietly(outer)
            close_quietly(tls)
