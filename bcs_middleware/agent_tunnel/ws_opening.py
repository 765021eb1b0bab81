"""The WebSocket opening handshake (RFC 6455 §4) of the agent tunnel, both ends, on ``wsproto``.

After it, :class:`~bcs_middleware.agent_tunnel.wschannel.WebSocketChannel` frames messages with
:mod:`.wsframes`. The client reads the server's answer head a byte at a time (once per
connection), so that what the server sends right after its ``101`` stays in the socket for
the channel; the answer is read up to 64 KiB within the caller's timeout, and a refusal's body
up to 4 KiB.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, RejectConnection, RejectData, Request
from wsproto.utilities import RemoteProtocolError

MAX_HANDSHAKE = 64 * 1024
MAX_REJECT_BODY = 4096
RECV_SIZE = 64 * 1024


class ChannelError(ConnectionError):
    """The channel cannot be used (closed, or the handshake failed); the message is safe to log."""


class HandshakeRejected(ChannelError):
    """The server answered the opening handshake with something other than 101.

    :param status: the HTTP status code.
    :param body: the first 4 KiB of the answer's body (e.g. the gateway's JSON error).
    """

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body
        super().__init__(f"the server refused the WebSocket upgrade: HTTP {status}")


def client_handshake(sock: socket.socket, *, host: str, path: str, headers: Sequence[tuple[str, str]],
                     timeout: float) -> dict[str, str]:
    """Do the client handshake on ``sock``; the server's ``101`` headers, names lower-cased.

    Raises :class:`HandshakeRejected` (status and the start of the body) when the server
    answers other than 101, :class:`ChannelError` on a malformed answer, a timeout or a lost
    connection. ``sock`` is left open on failure: the caller owns it.
    """
    ws = WSConnection(ConnectionType.CLIENT)
    extra = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]
    previous = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        sock.sendall(ws.send(Request(host=host, target=path, extra_headers=extra)))
        accepted = _Answer(ws).read(sock)
        sock.settimeout(previous)
        return accepted
    except TimeoutError:
        raise ChannelError(f"no WebSocket handshake answer within {timeout:g}s") from None
    except OSError as exc:
        if isinstance(exc, ChannelError):
            raise
        raise ChannelError(f"the connection failed during the WebSocket handshake: "
                           f"{type(exc).__name__}") from None


class _Answer:
    """The server's answer to the opening handshake, read off the socket into ``wsproto``."""

    def __init__(self, ws: WSConnection) -> None:
        self.ws = ws
        self.reject: RejectConnection | None = None
        self.body = bytearray()

    def read(self, sock: socket.socket) -> dict[str, str]:
        """The ``101``'s headers; raises as :func:`client_handshake` says."""
        received = 0
        head = bytearray()
        while True:
            # The head a byte at a time (once per connection): what the server sends after
            # its 101 stays in the socket for the channel, not in wsproto's buffer.
            data = sock.recv(RECV_SIZE if self.reject is not None else 1)
            if not data:
                if self.reject is not None:
                    raise HandshakeRejected(self.reject.status_code, bytes(self.body))
                raise ChannelError("the server closed the connection during the WebSocket handshake")
            received += len(data)
            if received > MAX_HANDSHAKE + MAX_REJECT_BODY:
                if self.reject is not None:  # a refusal with a long body: its start says enough
                    raise HandshakeRejected(self.reject.status_code, bytes(self.body))
                raise ChannelError("the WebSocket handshake answer is too large")
            if self.reject is None:
                head += data
                if not head.endswith(b"\r\n\r\n"):
                    continue
                data = bytes(head)
            try:
                accepted = self._receive(data)
            except RemoteProtocolError as exc:
                raise ChannelError(f"malformed WebSocket handshake answer: {exc}") from None
            if accepted is not None:
                return accepted

    def _receive(self, data: bytes) -> dict[str, str] | None:
        """Hand ``data`` to wsproto: the headers of its ``101``, ``None`` for more (a refusal's body),
        :class:`HandshakeRejected` once a refusal is whole."""
        self.ws.receive_data(data)
        for event in self.ws.events():
            if isinstance(event, AcceptConnection):
                return {bytes(name).decode("latin-1").lower(): bytes(value).decode("latin-1")
                        for name, value in event.extra_headers}
            if isinstance(event, RejectConnection):
                self.reject = event
                if not event.has_body:
                    raise HandshakeRejected(event.status_code, b"")
            elif isinstance(event, RejectData):
                self.body += event.data[: MAX_REJECT_BODY - len(self.body)]
                if event.body_finished and self.reject is not None:
                    raise HandshakeRejected(self.reject.status_code, bytes(self.body))
        return None


def server_handshake(sock: socket.socket, request_head: bytes, extra_headers: Sequence[tuple[str, str]]) -> None:
    """Answer the client's upgrade request ``request_head`` with 101 on ``sock``.

    Raises :class:`ChannelError` if the head is not a valid WebSocket upgrade request;
    nothing has been written to ``sock`` then.
    """
    ws = WSConnection(ConnectionType.SERVER)
    try:
        ws.receive_data(request_head)
        request = next((e for e in ws.events() if isinstance(e, Request)), None)
    except RemoteProtocolError as exc:
        raise ChannelError(f"not a WebSocket upgrade request: {exc}") from None
    if request is None:
        raise ChannelError("not a complete WebSocket upgrade request head")
    answer = ws.send(AcceptConnection(extra_headers=[
        (name.encode("latin-1"), value.encode("latin-1")) for name, value in extra_headers]))
    try:
        sock.sendall(answer)
    except OSError as exc:
        raise ChannelError(f"cannot answer the WebSocket upgrade: {type(exc).__name__}") from None
