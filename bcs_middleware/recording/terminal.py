"""What a remote-command stream carries, whatever its transport (pure).

kubectl's ``exec``/``attach`` streams (``k8s.io/client-go/tools/remotecommand``, the kubelet's
``pkg/kubelet/cri/streaming/remotecommand``) carry the same five streams over WebSocket and
SPDY: stdin, stdout, stderr, a resize stream of JSON ``TerminalSize`` objects
(``{"Width": 80, "Height": 24}``, client-go ``remotecommand/resize.go``: the struct has no JSON
tags) and an error stream whose ``v4`` payload is a ``metav1.Status``: ``Success``, or
``Failure`` with reason ``NonZeroExitCode`` and a cause ``{"reason": "ExitCode", "message":
"<code>"}`` (kubelet ``remotecommand/httpstream.go``, ``exec.go``). A decoder turns the bytes
of either transport into :class:`Piece` values; :class:`TerminalTracker` keeps the session's
outcome.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

__all__ = ["ERROR_LIMIT", "Piece", "StreamName", "TerminalTracker", "exit_code_of", "parse_sizes"]

StreamName = Literal["stdin", "stdout", "stderr", "resize", "error"]

#: The most of an error or resize stream kept to parse (a Status, a few TerminalSize objects).
ERROR_LIMIT = 64 * 1024


@dataclass(frozen=True, slots=True)
class Piece:
    """Some bytes of one stream; ``end``: that stream ended here."""

    stream: StreamName
    data: bytes
    end: bool = False


def exit_code_of(status: bytes) -> int | None:
    """The exit code a ``v4`` error-stream Status reports (``None``: no JSON Status, no code)."""
    try:
        doc = json.loads(status)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    if doc.get("status") == "Success":
        return 0
    if doc.get("reason") != "NonZeroExitCode":
        return None
    causes = (doc.get("details") or {}).get("causes") or []
    for cause in causes if isinstance(causes, list) else ():
        if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
            try:
                return int(str(cause.get("message")))
            except ValueError:
                return None
    return None


def parse_sizes(buffer: bytearray) -> list[tuple[int, int]]:
    """The complete ``TerminalSize`` objects at the start of ``buffer`` (consumed), as (cols, rows).

    client-go writes them with a ``json.Encoder`` (one object and a newline each); a
    partial object stays in the buffer for the next piece.
    """
    decoder = json.JSONDecoder()
    sizes: list[tuple[int, int]] = []
    text = buffer.decode("utf-8", "replace")
    at = 0
    while True:
        while at < len(text) and text[at] in " \t\r\n":
            at += 1
        if at >= len(text):
            break
        try:
            doc, at = decoder.raw_decode(text, at)
        except ValueError:
            break
        if isinstance(doc, dict):
            width, height = doc.get("Width"), doc.get("Height")
            if isinstance(width, int) and isinstance(height, int) and width >= 0 and height >= 0:
                sizes.append((width, height))
    del buffer[:len(text[:at].encode("utf-8", "replace"))]
    if len(buffer) > ERROR_LIMIT:
        buffer.clear()  # not TerminalSize objects: drop rather than grow
    return sizes


class TerminalTracker:
    """The error stream gathered (bounded) for the exit status the apiserver reports."""

    def __init__(self) -> None:
        self._error = bytearray()
        self.error_ended = False

    def feed_error(self, piece: Piece) -> None:
        if len(self._error) + len(piece.data) <= ERROR_LIMIT:
            self._error += piece.data
        if piece.end:
            self.error_ended = True

    def exit_code(self, *, empty_is_success: bool) -> int | None:
        """The exit code: from the Status; an error stream that ended empty is success when
        the protocol says so (SPDY ``v4``: no Status written means the command succeeded)."""
        if self._error:
            return exit_code_of(bytes(self._error))
        return 0 if self.error_ended and empty_is_success else None

    @property
    def message(self) -> str:
        """A failure's message (a Status ``message``, or older protocols' plain text)."""
        if not self._error:
            return ""
        try:
            doc = json.loads(self._error)
        except (ValueError, UnicodeDecodeError):
            return self._error.decode("utf-8", "replace")
        return str(doc.get("message", "")) if isinstance(doc, dict) and doc.get("status") != "Success" else ""
