"""The exit status of a session that is not recorded, read from its error channel (a splice tap).

The apiserver reports how the command ended on the remote-command error channel: a
``metav1.Status`` (``k8s.io/apimachinery/pkg/util/remotecommand``'s ``v4`` protocols and
later; kubectl's ``remotecommand.errorDecoderV4``). :class:`ExitStatusTap` decodes the
stream framing as the recorder does (:mod:`.websocket`, :mod:`.spdy`) and keeps the error
channel only (bounded: :class:`~.terminal.TerminalTracker`); stdin and output are parsed past
and dropped, never stored. For WebSocket the client's direction is not even parsed: the
error channel flows from the server, and channels are named in each message.
"""

from __future__ import annotations

from typing import Literal

from .spdy import SpdyDecoder
from .terminal import TerminalTracker
from .websocket import ChannelDecoder

__all__ = ["ExitStatusTap"]


class ExitStatusTap:
    """A :class:`~bcs_middleware.core.splice.SpliceTap` that only reads the exit status.

    :param transport: ``"websocket"`` or ``"spdy"`` (the ``Upgrade`` the apiserver accepted).
    :param subprotocol: WebSocket: the subprotocol the apiserver's ``101`` named (its codec).
    """

    def __init__(self, transport: str, subprotocol: str = "") -> None:
        self._spdy = transport == "spdy"
        self._decoder: ChannelDecoder | SpdyDecoder = SpdyDecoder() if self._spdy else ChannelDecoder(subprotocol)
        self._tracker = TerminalTracker()

    def observe(self, to_upstream: bool, data: bytes) -> None:
        if to_upstream and not self._spdy:
            return
        for piece in self._decoder.feed(to_upstream, data):
            if piece.stream == "error":
                self._tracker.feed_error(piece)

    def hold(self) -> Literal["go", "wait", "cut"]:
        return "go"

    @property
    def exit_code(self) -> int | None:
        return self._tracker.exit_code(empty_is_success=self._spdy)
