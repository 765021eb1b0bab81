"""A hand-written, hostile agent for attack tests: raw WebSocket frames over real TLS, no session.

It opens the tunnel endpoint of a real gateway as bcs-kube-agent does (the ``BCS-API-Tunnel-*``
headers), then writes whatever frames a test builds — as fast as the gateway takes them — and
reads only when the test says so. Everything it does is bounded in bytes and seconds.
"""

from __future__ import annotations

import base64
import os
import socket
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path

from bcs_middleware.agent_tunnel.frames import Message, decode, encode
from bcs_middleware.agent_tunnel.wsframes import OP_BINARY, OP_CLOSE, OP_CONTINUATION, OP_PING, Frames, parse_close

CONNECT = "/bcsapi/v1/websocket/connect"


def worker_pid(master_pid: int) -> int:
    """The one gunicorn worker of ``master_pid`` (``--workers 1``)."""
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def vm_bytes(pid: int, field_name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(field_name)


def reset_peak(pid: int) -> None:
    """Start ``VmHWM`` over from the current RSS (Linux: ``clear_refs`` 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


@dataclass
class Flood:
    """What :meth:`HostileAgent.flood` did."""

    sent: int = 0
    seconds: float = 0.0
    cut: bool = False  # the gateway ended the connection (a send failed)
    stalled: bool = False  # the gateway stopped taking bytes for ``stall`` seconds


@dataclass
class Received:
    """What the gateway wrote, as read back by :meth:`HostileAgent.drain`."""

    messages: list[Message] = field(default_factory=list)
    pongs: int = 0
    close_code: int | None = None
    close_reason: str = ""
    eof: bool = False


class HostileAgent:
    """One tunnel connection to ``port`` that speaks raw frames (see the module docstring).

    :param rcvbuf: the socket's receive buffer: small, so that not reading is felt soon.
    """

    def __init__(self, port: int, context: ssl.SSLContext, headers: dict[str, str], *, rcvbuf: int = 4096,
                 server_hostname: str = "localhost") -> None:
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        raw.settimeout(10)
        raw.connect(("127.0.0.1", port))
        self.sock = context.wrap_socket(raw, server_hostname=server_hostname)
        lines = [f"GET {CONNECT} HTTP/1.1", f"Host: localhost:{port}", "Connection: Upgrade",
                 "Upgrade: websocket", "Sec-WebSocket-Version: 13",
                 "Sec-WebSocket-Key: " + base64.b64encode(os.urandom(16)).decode(),
                 *(f"{name}: {value}" for name, value in headers.items())]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = b""
        while not head.endswith(b"\r\n\r\n"):  # a byte at a time: what follows stays in the socket
            byte = self.sock.recv(1)
            if not byte:
                raise ConnectionError(f"closed during the handshake: {head!r}")
            head += byte
            assert len(head) < 65536
        self.status = int(head.split(b" ", 2)[1])
        self.head = head
        self.frames = Frames(client=True, max_message=4 << 20)

    # -- building frames -------------------------------------------------------------------

    def frame(self, opcode: int, payload: bytes = b"", *, fin: bool = True) -> bytes:
        """One masked frame; ``fin=False`` for a fragment that more will follow."""
        wire = self.frames.frame(opcode, payload)
        return wire if fin else bytes((wire[0] & 0x7F,)) + wire[1:]

    def ping(self, payload: bytes = b"p" * 125) -> bytes:
        return self.frame(OP_PING, payload)

    def message(self, message: Message) -> bytes:
        return self.frame(OP_BINARY, encode(message))

    def fragments(self, sizes: list[int]) -> bytes:
        """A binary message in fragments of ``sizes`` bytes (the last one unfinished: more may follow)."""
        pieces = [self.frame(OP_BINARY if i == 0 else OP_CONTINUATION, b"\0" * size, fin=False)
                  for i, size in enumerate(sizes)]
        return b"".join(pieces)

    # -- writing and reading ----------------------------------------------------------------

    def flood(self, blob: bytes, *, seconds: float, max_bytes: int, stall: float = 1.0) -> Flood:
        """Send ``blob`` again and again, never reading, until the gateway cuts the connection,
        stops taking bytes for ``stall`` seconds, or ``seconds``/``max_bytes`` are reached."""
        result = Flood()
        started = time.monotonic()
        self.sock.settimeout(stall)
        view = memoryview(blob)
        try:
            while time.monotonic() - started < seconds and result.sent < max_bytes:
                try:
                    sent = self.sock.send(view)
                except (TimeoutError, ssl.SSLWantWriteError):
                    result.stalled = True
                    break
                result.sent += sent
                view = view[sent:] or memoryview(blob)
        except (OSError, ssl.SSLError):
            result.cut = True
        result.seconds = time.monotonic() - started
        return result

    def send(self, data: bytes) -> None:
        self.sock.settimeout(10)
        self.sock.sendall(data)

    def drain(self, timeout: float = 15.0, *, max_bytes: int = 256 << 20) -> Received:
        """Read what the gateway wrote until it closes the connection (bounded): its messages,
        how many pongs, and its close frame."""
        received = Received()
        deadline = time.monotonic() + timeout
        total = 0
        while time.monotonic() < deadline and total < max_bytes:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                break
            except (OSError, ssl.SSLError):
                received.eof = True
                break
            if not data:
                received.eof = True
                break
            total += len(data)
            self.frames.feed(data)
            while (event := self.frames.next()) is not None:
                opcode, payload = event
                if opcode == OP_BINARY:
                    received.messages.append(decode(payload))
                elif opcode == OP_CLOSE:
                    received.close_code, received.close_reason = parse_close(payload)
                elif opcode == 0xA:
                    received.pongs += 1
        return received

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
