"""The server side of RFC 6455 framing, for the fake WebSocket endpoints of the tests."""

from __future__ import annotations

import time
from typing import Any


def as_a_kubelet_starts() -> None:
    """Wait, between a fake pod's ``101`` and its first output, as long as a kubelet takes to start
    the command.

    kubectl ≤ 1.32 (client-go's WebSocket executor) starts reading before it has created its
    streams, and drops what arrives in between ("Unknown stream id 1, discarding message"; the
    exit status too, and then exits 0: kubernetes/kubernetes#131189, fixed by #131203). A real
    kubelet starts a process before anything is written; a fake that answers at once hits the race.
    There is nothing to poll: the client says nothing when its streams are ready.
    """
    time.sleep(0.3)


def read_frame(rfile: Any) -> tuple[int | None, bytes]:
    """``(opcode, payload)`` of the next frame (unmasked); ``(None, b"")`` at end of input."""
    head = rfile.read(2)
    if len(head) < 2:
        return None, b""
    opcode, length = head[0] & 0x0F, head[1] & 0x7F
    if length == 126:
        length = int.from_bytes(rfile.read(2), "big")
    elif length == 127:
        length = int.from_bytes(rfile.read(8), "big")
    mask = rfile.read(4) if head[1] & 0x80 else b""
    data = rfile.read(length)
    if mask:  # XOR with the repeated key, as one big integer (fast for MiBs)
        key = (mask * (length // 4 + 1))[:length]
        data = (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(length, "big")
    return opcode, data


def frame(opcode: int, payload: bytes) -> bytes:
    """A final, unmasked frame (servers never mask)."""
    size = len(payload)
    if size < 126:
        return bytes([0x80 | opcode, size]) + payload
    if size < 65536:
        return bytes([0x80 | opcode, 126]) + size.to_bytes(2, "big") + payload
    return bytes([0x80 | opcode, 127]) + size.to_bytes(8, "big") + payload
